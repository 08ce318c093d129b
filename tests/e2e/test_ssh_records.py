"""Any controller can act on a deployment: host records on the SSH test bed.

`up` from folder A; from folder B, which has no state (its own KVPD_STATE_DIR), `status`,
`logs`, `diagnose`, `restart` of one process and `down` with the same profile and inventory;
tampered host records (pgid 1, another deployment's name, a wrong start time) refused and
nothing of theirs killed; A's `status` after B's `down` shows the deployment stopped; a second
deployment on the same hosts refused naming the first and its owner.

The engines are the day-two tests' ready fake (fault injection stand-in: a CPU vLLM per host
would take minutes and prove nothing more here); plan, SSH transport, records, executor and
kvpd's proxy are real.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvpd.exec.records.model import RECORD_FILE
from kvpd.exec.ssh import SSHTransport
from tests.e2e.test_ssh_day2 import fakes  # noqa: F401  (fixture)
from tests.e2e.test_ssh_faults import PROFILE, SPREAD, busy, inventory
from tests.e2e.test_ssh_rehearsal import UCM4_HOSTS, kvpd
from tests.testbed import Testbed

pytestmark = [pytest.mark.e2e, pytest.mark.ssh]


def _status(state_dir: Path, *profile_args: str) -> dict:
    return json.loads(kvpd(state_dir, "status", *profile_args, "--json").stdout)


def _host(bed: Testbed, name: str) -> SSHTransport:
    return SSHTransport(bed.spec(UCM4_HOSTS[name], name=name))


def _tamper(bed: Testbed, host: str, run_dir: str, change) -> bytes:
    """Rewrite `host`'s record with `change` applied; the original bytes."""
    t = _host(bed, host)
    try:
        path = f"{run_dir}/{RECORD_FILE}"
        raw = t.read(path)
        d = json.loads(raw)
        change(d)
        t.put(path, json.dumps(d).encode(), mode=0o600)
        return raw
    finally:
        t.close()


def _restore(bed: Testbed, host: str, run_dir: str, raw: bytes) -> None:
    t = _host(bed, host)
    try:
        t.put(f"{run_dir}/{RECORD_FILE}", raw, mode=0o600)
    finally:
        t.close()


def _alive(bed: Testbed, host: str, pid: int, ticks: int) -> bool:
    t = _host(bed, host)
    try:
        return t.alive(pid, start_ticks=ticks)
    finally:
        t.close()


def test_any_controller_acts_on_the_hosts_records(  # noqa: PLR0915 - one scenario, in order
    bed: Testbed,
    fakes: dict[str, Path],  # noqa: F811
    tmp_path: Path,
) -> None:
    inv = inventory(tmp_path, bed, fakes["ready"], UCM4_HOSTS, health_timeout_s=60)
    a, b = tmp_path / "A" / "state", tmp_path / "B" / "state"
    a.parent.mkdir()
    b.parent.mkdir()
    prof = [PROFILE, "--rehearse", "--inventory", str(inv), *SPREAD]
    hosts = list(UCM4_HOSTS.values())
    kvpd(a, "up", *prof, "--yes", "--skip-preflight", "--no-canary", "--grace", "5")
    cache = json.loads((a / PROFILE / "state.json").read_text())
    run_dirs, pids = cache["run_dirs"], {p["name"]: p for p in cache["processes"]}
    try:
        # B has no state: status, logs, from the hosts' records.
        st = _status(b, *prof)
        assert {p["name"] for p in st["processes"]} == set(pids), st
        assert all(p["alive"] for p in st["processes"]), st
        assert st["drift"] == {"running_plan_digests": [], "processes": []}, st["drift"]
        assert "@" in st["started_by"]
        assert st["refused_records"] == {}
        log = kvpd(b, "logs", *prof[:1], "decode-0", *prof[1:]).stdout
        assert "fake engine: serving on" in log, log
        assert not (b / PROFILE / "state.json").exists()  # B keeps no cache of its own
        r = kvpd(b, "diagnose", *prof)
        assert "Archive:" in r.stdout, r.stdout
        assert "decode-0" in r.stdout, r.stdout

        # A second deployment on the same hosts, from B: refused, naming the first's owner.
        r = kvpd(b, "up", *prof, "--set", "name=second", "--yes", "--skip-preflight",
                 "--no-canary", check=False)  # fmt: skip
        out = r.stdout + r.stderr
        assert r.returncode != 0, out
        assert "refused before anything started" in out, out
        assert f"of kvpd deployment '{PROFILE}' (started by {st['started_by']}" in out, out
        # ... and the same deployment again from B: already running, named.
        r = kvpd(b, "up", *prof, "--yes", "--skip-preflight", "--no-canary", check=False)
        assert r.returncode != 0, r.stdout + r.stderr
        assert "already" in r.stdout + r.stderr, r.stdout + r.stderr

        # Restart one process from B: a new PID, recorded on its host; A's status sees it.
        r = kvpd(b, "restart", *prof[:1], "decode-0", *prof[1:], "--no-canary", "--grace", "5")
        assert "restarted decode-0" in r.stdout, r.stdout
        st_a = {p["name"]: p for p in _status(a, PROFILE)["processes"]}
        assert st_a["decode-0"]["pid"] != pids["decode-0"]["pid"]
        assert st_a["decode-0"]["alive"]
        assert st_a["prefill-0"]["pid"] == pids["prefill-0"]["pid"]

        # Tampered records: pgid 1 (d1), another deployment's name (p1), a wrong start time
        # (d2): refused or left alone, nothing of theirs killed.
        d1 = st_a["decode-0"]
        saved = {
            "d1": _tamper(bed, "d1", run_dirs["d1"],
                          lambda d: d["processes"][0].update(pgid=1)),
            "p1": _tamper(bed, "p1", run_dirs["p1"], lambda d: d.update(deployment="other")),
            "d2": _tamper(bed, "d2", run_dirs["d2"],
                          lambda d: d["processes"][0].update(start_ticks=12345)),
        }  # fmt: skip
        r = kvpd(b, "down", *prof, "--grace", "5", check=False)
        out = r.stdout + r.stderr
        assert r.returncode != 0, out
        assert "pgid: 1 is not its own process group" in out, out
        assert "another deployment's record" in out, out
        assert "is another process now" in out or "not running" in out, out
        assert _alive(bed, "d1", d1["pid"], _ticks(a, "decode-0"))
        assert _alive(bed, "p1", pids["prefill-0"]["pid"], pids["prefill-0"]["start_ticks"])
        d2 = pids["decode-1"]
        assert _alive(bed, "d2", d2["pid"], d2["start_ticks"])
        for h, raw in saved.items():
            _restore(bed, h, run_dirs[h], raw)
    finally:
        r = kvpd(b, "down", *prof, "--json", "--grace", "5", check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["clean"], r.stdout + r.stderr
    assert busy(bed, hosts) == {}

    # A's cache agrees: stopped, not healthy.
    st = _status(a, PROFILE)
    assert st["status"] == "down", st
    assert not any(p["alive"] for p in st["processes"]), st
    assert json.loads((a / PROFILE / "state.json").read_text())["status"] == "down"


def _ticks(state_dir: Path, name: str) -> int:
    """The start ticks A's cache has for `name` (updated by A's last status)."""
    cache = json.loads((state_dir / PROFILE / "state.json").read_text())
    return next(p["start_ticks"] for p in cache["processes"] if p["name"] == name)
