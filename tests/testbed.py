"""The SSH test bed of scripts/testbed.sh as a session fixture, `testbed`, for the end-to-end
tests and the SSH case of the unit transport contract alike: one bed a session, whichever
folder asks first. Loaded as a plugin by tests/conftest.py, so no test module imports it as a
fixture."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from kvpd.plan.value import HostSpec

REPO = Path(__file__).resolve().parents[1]
TESTBED_SH = REPO / "scripts" / "testbed.sh"
TESTBED_HOSTS = 8  # large-ep rehearsed at full size (test_ssh_topology.py)


@dataclass(frozen=True)
class Testbed:
    """The SSH test bed of scripts/testbed.sh: hosts h1..hN reachable as root."""

    __test__ = False  # not a test class, despite the name

    dir: Path
    addresses: dict[str, str]  # "h1" -> "10.213.0.11"
    key: str
    known_hosts: str
    ssh_config: str

    @property
    def names(self) -> list[str]:
        return list(self.addresses)

    def spec(self, host: str, **overrides: object) -> HostSpec:
        """A HostSpec for bed host `host` with the bed's key and known_hosts."""
        base = HostSpec(
            name=host,
            address=self.addresses[host],
            transport="ssh",
            user="root",
            key=self.key,
            known_hosts=self.known_hosts,
        )
        return replace(base, **overrides)  # type: ignore[arg-type]

    def host_key_pub(self, name: str) -> str:
        return str(self.dir / name / "ssh_host_ed25519_key.pub")


def not_root() -> str | None:
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "the SSH test bed needs root (network namespaces, mounts)"
    return None


def engine_or_services_missing() -> str | None:
    venv, services = REPO / ".venv-engine" / "bin", REPO / ".venv-services" / "bin"
    for path, fix in (
        (venv / "vllm", "make engine"),
        (REPO / ".kvpd" / "models" / "tiny" / "config.json", "make model"),
        (services / "python", "make services"),
        (services / "mooncake_master", "make services"),
    ):
        if not path.exists():
            return f"{path} is missing (run `{fix}`)"
    return None


def testbed_unavailable() -> str | None:
    """Why the test bed cannot run here, or None."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "the SSH test bed needs root (network namespaces, mounts); run as root"
    if shutil.which("ip") is None and shutil.which("apt-get") is None:
        return "`ip` (iproute2) is missing and apt-get is not available to install it"
    if shutil.which("ip") is not None:
        r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
        if r.returncode != 0:
            return f"`ip netns` is unavailable: {r.stderr.strip()}"
    if shutil.which("unshare") is not None:
        r = subprocess.run(["unshare", "--net", "--mount", "true"], capture_output=True, text=True)
        if r.returncode != 0:
            return f"cannot create namespaces here (unshare: {r.stderr.strip()})"
    return None


def other_python() -> str | None:
    """An interpreter (>= 3.10) of another version than the one running the tests, for the
    node-bundle test's proxy host (pyenv's or the system's), or None."""
    import glob

    mine = f"{sys.version_info[0]}.{sys.version_info[1]}"
    found = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.1*/bin/python3")))
    found += sorted(glob.glob("/usr/bin/python3.1[0-9]"))
    for py in found:
        r = subprocess.run(
            [py, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
        )
        v = r.stdout.strip()
        if r.returncode == 0 and v != mine and tuple(map(int, v.split("."))) >= (3, 10):
            return os.path.realpath(py) if "/usr/bin/" in py else py
    return None


def _testbed_env() -> dict[str, str]:
    # The hosts must see the Python running the tests (the venv's base installation may live
    # under the private /root), and the second Python of the node-bundle test.
    env = {**os.environ, "PYTHON": sys.executable}
    extra = other_python()
    if extra:
        env["EXTRA_PYTHONS"] = f"{env.get('EXTRA_PYTHONS', '')} {extra}".strip()
    return env


@pytest.fixture(scope="session")
def testbed() -> Iterator[Testbed]:
    """Bring up scripts/testbed.sh with TESTBED_HOSTS hosts for the session, tear it down after
    (set KVPD_TESTBED_KEEP=1 to leave it up, e.g. while another session uses it)."""
    why = testbed_unavailable()
    if why:
        pytest.skip(why)
    r = subprocess.run(
        ["bash", str(TESTBED_SH), "up", str(TESTBED_HOSTS)],
        capture_output=True,
        text=True,
        env=_testbed_env(),
        timeout=600,
    )
    if r.returncode != 0:
        pytest.fail(f"testbed.sh up failed:\n{r.stdout}\n{r.stderr}")
    bed_dir = Path(os.environ.get("KVPD_TESTBED_DIR") or REPO / ".kvpd" / "testbed").resolve()
    addresses = dict(
        line.split()[:2] for line in (bed_dir / "hosts").read_text().splitlines() if line.strip()
    )
    try:
        yield Testbed(
            dir=bed_dir,
            addresses=addresses,
            key=str(bed_dir / "id_ed25519"),
            known_hosts=str(bed_dir / "known_hosts"),
            ssh_config=str(bed_dir / "ssh_config"),
        )
    finally:
        if not os.environ.get("KVPD_TESTBED_KEEP"):
            subprocess.run(
                ["bash", str(TESTBED_SH), "down"],
                capture_output=True,
                env=_testbed_env(),
                timeout=120,
            )
