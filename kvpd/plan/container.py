"""Containers on the nodes (pure): the per-host `ContainerSpec` and the runtime command lines
kvpd renders from it: `run` (shown by `kvpd plan`; executed by `up` when kvpd starts the
container), `exec` (the prefix of every command kvpd runs for that host's processes), `rm`.

Everything here is data for the runtime's argv; no shell ever sees these words unquoted (the
transport quotes them, kvpd.exec.ssh.commands).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# What a runtime's `run` needs for Ascend NPUs (the vLLM-Ascend container guide's devices and
# driver mounts); davinci<N> are added per NPU the plan assigns to the host.
ASCEND_DEVICES = ("/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc")
ASCEND_MOUNTS = (
    ("/usr/local/Ascend/driver", "ro"),
    ("/usr/local/dcmi", "ro"),
    ("/usr/local/bin/npu-smi", "ro"),
    ("/etc/ascend_install.info", "ro"),
)
DEFAULT_COMMAND = {"docker": "docker", "podman": "podman", "standin": "kvpd-standin-runtime"}
# Label on containers kvpd starts: `down` removes only containers carrying it.
LABEL = "kvpd.deployment"
IMAGE_PLACEHOLDER = "IMAGE"  # in the `run` line shown for a container the user starts
SHM_HEADROOM_GB = 1  # torch and engine IPC beyond the sized buffers


@dataclass(frozen=True)
class ContainerSpec:
    """The container one host's processes run in."""

    runtime: str  # docker | podman | standin (the namespace stand-in, tests only)
    command: str  # the runtime's program on the host
    name: str
    image: str = ""  # empty: the user runs the container, kvpd only execs into it
    shm_gb: int = 0
    devices: tuple[str, ...] = ()  # device nodes passed through
    mounts: tuple[str, ...] = ()  # "src:dst[:opts]"
    deployment: str = ""

    @property
    def started_by_kvpd(self) -> bool:
        return bool(self.image)

    @property
    def standin(self) -> bool:
        return self.runtime == "standin"

    def exec_argv(
        self, argv: list[str] | tuple[str, ...], pass_env: Sequence[str] = ()
    ) -> list[str]:
        """`argv` run inside the container (what the runtime's exec does: enter its
        namespaces; no TTY, no stdin: kvpd's commands read none). `pass_env`: variables the
        runtime passes on from its own environment by name (`-e NAME`, no value in argv)."""
        env = [w for name in pass_env for w in ("-e", name)]
        return [self.command, "exec", *env, self.name, *argv]

    def run_argv(self) -> list[str]:
        """The command that starts this container, detached, kept alive by a no-op command."""
        out = [self.command, "run", "-d", "--name", self.name]
        out += ["--label", f"{LABEL}={self.deployment}"]
        out += ["--network", "host", "--ipc", "host", "--init"]
        if self.shm_gb:
            out.append(f"--shm-size={self.shm_gb}g")
        for dev in self.devices:
            out += ["--device", dev]
        for m in self.mounts:
            out += ["-v", m]
        out += [self.image or IMAGE_PLACEHOLDER, "sleep", "infinity"]
        return out

    def rm_argv(self) -> list[str]:
        return [self.command, "rm", "-f", self.name]

    def inspect_argv(self) -> list[str]:
        """State, image digest and kvpd's label, one per line."""
        fmt = '{{.State.Status}}\n{{.Image}}\n{{index .Config.Labels "' + LABEL + '"}}'
        return [self.command, "inspect", "--type", "container", "--format", fmt, self.name]

    def to_dict(self) -> dict[str, Any]:
        return {
            "runtime": self.runtime,
            "command": self.command,
            "name": self.name,
            "image": self.image,
            "shm_gb": self.shm_gb,
            "devices": list(self.devices),
            "mounts": list(self.mounts),
            "deployment": self.deployment,
        }

    @staticmethod
    def from_dict(d: dict[str, Any]) -> ContainerSpec:
        return ContainerSpec(
            runtime=d["runtime"],
            command=d["command"],
            name=d["name"],
            image=d.get("image", ""),
            shm_gb=int(d.get("shm_gb", 0)),
            devices=tuple(d.get("devices", ())),
            mounts=tuple(d.get("mounts", ())),
            deployment=d.get("deployment", ""),
        )


def shm_size_gb(explicit: float | None, needed_gb: float) -> int:
    """--shm-size: the profile's value, else what the plan sizes (UCM cache buffers) plus
    headroom, in whole GiB."""
    if explicit:
        return math.ceil(explicit)
    return math.ceil(needed_gb) + SHM_HEADROOM_GB


def container_spec(
    c: Any,  # kvpd.profile.container_schema.Container (Any: keeps this module schema-free)
    *,
    deployment: str,
    hardware: str,
    npus: tuple[int, ...],
    shm_needed_gb: float,
    run_dir: str,
    data_dirs: tuple[tuple[str, ...], tuple[str, ...]],
) -> ContainerSpec:
    """The container of one host: devices from the NPUs the plan assigns to it, the driver
    mounts on Ascend hardware, the run dir and data folders at the same path inside (`data_dirs`:
    read-only ones, the model folders a compromised engine must not rewrite for its peers;
    read-write ones, KV storage)."""
    devices: tuple[str, ...] = ()
    mounts: list[str] = []
    if hardware in ("a2", "a3", "950"):
        devices = tuple(f"/dev/davinci{n}" for n in sorted(set(npus))) + ASCEND_DEVICES
        mounts += [f"{src}:{src}:{opt}" for src, opt in ASCEND_MOUNTS]
    read_only, writable = data_dirs
    for d, opt in [(d, ":ro") for d in read_only] + [(d, "") for d in (*writable, run_dir)]:
        m = f"{d}:{d}{opt}"
        if d.startswith("/") and m not in mounts:
            mounts.append(m)
    return ContainerSpec(
        runtime=c.runtime,
        command=c.command or DEFAULT_COMMAND[c.runtime],
        name=c.name or f"kvpd-{deployment}",
        image=c.image or "",
        shm_gb=shm_size_gb(c.shm_gb, shm_needed_gb),
        devices=devices,
        mounts=tuple(mounts),
        deployment=deployment,
    )
