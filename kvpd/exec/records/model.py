"""The host record: what kvpd started on one host, for one deployment.

It names per process the identity the PID-reuse guard needs (PID, process group, /proc start
ticks), the ports, devices, log and role, and a digest of what was launched (command, env,
launch script) so drift is named per process; per host the deployment, the plan digest, who
started it (user@host), when, and the kvpd that wrote it.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import socket
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from kvpd import __version__
from kvpd.plan.value import Plan, ProcessSpec
from kvpd.profile.roles import Role

RECORD_FILE = ".kvpd-host-record.json"  # in the host's run dir, mode 0600
RECORD_FORMAT = 1
# The per-user index on each host: one file per deployment naming its run dir, so another
# deployment's `up` finds the records on that host without knowing their profiles (entries
# are `<deployment>@<run dir hash>`, see hostio.index_path).
INDEX_DIR = "~/.kvpd/deployments"

ProcessStatusWord = Literal["running", "healthy", "failed", "stopped"]
DeploymentStatus = Literal["starting", "up", "failed", "stopping", "down"]


@dataclass
class RecordedProcess:
    """One process kvpd started on the record's host."""

    name: str
    role: Role
    stage: int
    pid: int
    pgid: int
    start_ticks: int
    ports: list[int]
    devices: list[int]
    log: str  # absolute, under the run dir
    started_at: float
    launch_digest: str
    status: ProcessStatusWord = "running"


@dataclass
class HostRecord:
    """Everything kvpd started on `host` for `deployment`."""

    deployment: str
    host: str
    run_dir: str  # absolute on the host
    plan_digest: str
    started_by: str  # user@host of the controller
    started_at: float
    kvpd_version: str = __version__
    updated_at: float = 0.0
    processes: list[RecordedProcess] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for p in d["processes"]:
            p["role"] = str(p["role"])  # JSON keeps the plain word
        return {"format": RECORD_FORMAT, **d}

    def to_bytes(self) -> bytes:
        return json.dumps(self.to_dict(), indent=1).encode()

    def process(self, name: str) -> RecordedProcess | None:
        return next((p for p in self.processes if p.name == name), None)


def controller_id() -> str:
    """user@host of this controller, as records name who started a deployment."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (containers)
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def launch_digest(plan: Plan, spec: ProcessSpec) -> str:
    """What was launched for `spec`: its command, env, ports, devices and launch script (secrets
    masked, as everywhere a plan is shown), hashed. Equal digests: the same launch."""
    script = next(
        (f.content for f in plan.files if f.host == spec.host and f.path == spec.script), ""
    )
    text = json.dumps(
        [spec.command, spec.env, spec.ports, spec.devices, spec.host, spec.role, script],
        default=list,
    )
    for s in sorted(plan.secret_values, key=len, reverse=True):
        text = text.replace(s, "****")
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:32]
