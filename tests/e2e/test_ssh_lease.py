"""One change at a time, on the SSH test bed: the lease `up`, `down` and `restart` take on the
deployment's first host (kvpd.exec.lease.host).

Controller A runs in its own UTS namespace named `laptop-a`, so to controller B (this machine's
host name) it is another machine: B cannot tell from its own process table whether A still runs
and must go by the lease's expiry, as it would with a colleague's laptop. The engines are a
stand-in that never becomes healthy (so A's `up` runs as long as the test needs); plan, SSH
transport, executor and the lease snippet on the hosts are real. The profile's time to live is
set small (runtime.lease_s) to keep the waits short.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvpd.exec.ssh import SSHTransport
from tests.e2e.test_ssh_faults import PROFILE, busy, fake_engine_in, inventory, up_args
from tests.e2e.test_ssh_faults import wait_for_records as recorded
from tests.e2e.test_ssh_rehearsal import SHARED, UCM4_HOSTS, kvpd, kvpd_cmd, kvpd_env
from tests.testbed import Testbed

pytestmark = [pytest.mark.e2e, pytest.mark.ssh]

LEASE_HOST = "d1"  # the first of the profile's hosts by name (p1, d1, p2, d2)
HOSTS = list(UCM4_HOSTS.values())


@pytest.fixture(scope="module")
def never_healthy() -> Iterator[Path]:
    yield from fake_engine_in(SHARED / "lease")


def start_as(machine: str, state_dir: Path, *args: str) -> subprocess.Popen[str]:
    """`kvpd ARGS` as if on machine `machine` (its own host name; `exec` keeps the PID kvpd's)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    script = 'hostname "$0" && exec "$@"'
    return subprocess.Popen(
        ["unshare", "--uts", "sh", "-c", script, machine, *kvpd_cmd(*args)],
        cwd=state_dir.parent,
        env=kvpd_env(state_dir),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )


def lease_on_host(bed: Testbed) -> dict | None:
    t = SSHTransport(bed.spec(UCM4_HOSTS[LEASE_HOST], name=LEASE_HOST))
    try:
        return json.loads(t.read(t.resolve(f"~/.kvpd/leases/{PROFILE}.json")))
    except FileNotFoundError:
        return None
    finally:
        t.close()


def said(r: subprocess.CompletedProcess[str]) -> str:
    return " ".join((r.stdout + r.stderr).split())  # the console wraps long lines


def holder_of(pid: int) -> str:
    return f"deployment '{PROFILE}' is being changed by root@laptop-a (kvpd pid {pid}, up) since "


def killed_up(tmp_path: Path, bed: Testbed, engine: Path, lease_s: int) -> tuple[Path, int]:
    """A's `up`, SIGKILLed once its engines run: its state dir and PID."""
    inv = inventory(tmp_path, bed, engine, UCM4_HOSTS)
    a = tmp_path / "a" / "state"
    ttl = ["--set", f"runtime.lease_s={lease_s}"]
    proc = start_as("laptop-a", a, *up_args(inv), *ttl, "--skip-preflight", "--grace", "5")
    try:
        recorded(a, 4, proc)
    finally:
        proc.kill()  # no release, no rollback: the lease and the engines stay
        proc.communicate()
    return a, proc.pid


def test_a_second_up_is_refused_naming_the_first_while_it_runs(
    bed: Testbed, never_healthy: Path, tmp_path: Path
) -> None:
    inv = inventory(tmp_path, bed, never_healthy, UCM4_HOSTS)
    a, b = tmp_path / "a" / "state", tmp_path / "b" / "state"
    b.mkdir(parents=True)
    ttl = ["--set", "runtime.lease_s=3"]
    proc = start_as("laptop-a", a, *up_args(inv), *ttl, "--skip-preflight", "--grace", "5")
    try:
        recorded(a, 4, proc)
        time.sleep(4)  # past the time to live: only A's renewals keep its lease
        r = kvpd(b, *up_args(inv), *ttl, "--skip-preflight", check=False)
        print(r.stderr)  # the message a user sees (pytest -s)
        assert r.returncode == 1, said(r)
        assert holder_of(proc.pid) in said(r), said(r)
        assert "unless renewed; wait, or `--break-lease` to take it over" in said(r)
        assert f"(lease: {LEASE_HOST}:~/.kvpd/leases/{PROFILE}.json)" in said(r)
        held = lease_on_host(bed)
        assert held is not None
        assert held["holder"]["host"] == "laptop-a"
        assert held["seq"] >= 1
        assert held["holder"]["pid"] == proc.pid
        assert held["operation"] == "up"
        # read-only verbs need no lease
        rows = json.loads(kvpd(a, "status", PROFILE, "--json").stdout)["processes"]
        assert len(rows) >= 4
        assert proc.poll() is None
        # A's four engines only. Counted by their script: A renews its lease every second
        # here (a third of the 3 s), and a renewal's `sh` on the lease host may be in any `ps`.
        engines = [p for ps in busy(bed, HOSTS).values() for p in ps if never_healthy.name in p]
        assert len(engines) == 4, busy(bed, HOSTS)
    finally:
        proc.send_signal(signal.SIGINT)  # Ctrl-C: A rolls back and releases its lease
        out, err = proc.communicate(timeout=120)
    assert proc.returncode != 0, out + err
    assert lease_on_host(bed) is None, out + err
    assert busy(bed, HOSTS) == {}


def test_a_killed_ups_lease_expires_then_down_proceeds(
    bed: Testbed, never_healthy: Path, tmp_path: Path
) -> None:
    a, pid = killed_up(tmp_path, bed, never_healthy, lease_s=5)
    killed = time.monotonic()
    try:
        r = kvpd(a, "down", PROFILE, "--grace", "5", check=False)
        assert r.returncode == 1, said(r)
        assert holder_of(pid) in said(r), said(r)
        assert set(busy(bed, HOSTS)) == set(HOSTS)  # refused: nothing was stopped
        assert len(json.loads(kvpd(a, "status", PROFILE, "--json").stdout)["processes"]) == 4
        time.sleep(max(0.0, killed + 6.5 - time.monotonic()))  # TTL 5 s, whole seconds
        r = kvpd(a, "down", PROFILE, "--grace", "5", "--json", check=False)
        assert r.returncode == 0, said(r)
        assert busy(bed, HOSTS) == {}
        assert lease_on_host(bed) is None  # down released the lease it took over
    finally:
        kvpd(a, "down", PROFILE, "--grace", "5", "--break-lease", "--yes", check=False)


def test_break_lease_takes_a_live_lease_over_after_confirmation(
    bed: Testbed, never_healthy: Path, tmp_path: Path
) -> None:
    a, pid = killed_up(tmp_path, bed, never_healthy, lease_s=120)
    try:
        down = ["down", PROFILE, "--grace", "5", "--break-lease"]
        r = subprocess.run(
            kvpd_cmd(*down), cwd=a.parent, env=kvpd_env(a), stdin=subprocess.DEVNULL,
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert r.returncode == 2, said(r)
        assert "pass --yes with --break-lease" in said(r), said(r)
        assert set(busy(bed, HOSTS)) == set(HOSTS)
        assert (lease_on_host(bed) or {}).get("holder", {}).get("pid") == pid
        r = kvpd(a, *down, "--yes", "--json", check=False)
        assert r.returncode == 0, said(r)
        assert busy(bed, HOSTS) == {}
        assert lease_on_host(bed) is None
    finally:
        kvpd(a, "down", PROFILE, "--grace", "5", "--break-lease", "--yes", check=False)
