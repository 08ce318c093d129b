"""Host records: what `up` writes on each host, how strictly a record is read back, and the
messages of refused records, conflicts, drift and a cache that no longer matches its profile.

Real local processes and the LocalTransport (the record files are real files in a run dir);
the tampering is done by hand to the JSON, as someone with the deployment user's login could.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from kvpd.cli import records_out
from kvpd.errors import StateError
from kvpd.exec.fanout import Fanout
from kvpd.exec.local import LocalTransport
from kvpd.exec.processes.stop import Stopper
from kvpd.exec.records import hostio
from kvpd.exec.records.conflicts import conflicts, port_holders
from kvpd.exec.records.current import read_current
from kvpd.exec.records.model import RECORD_FILE
from kvpd.exec.records.validate import MAX_RECORD_BYTES, RecordRefused, parse
from kvpd.exec.report import NullReporter
from kvpd.exec.service import Deployments
from kvpd.exec.state import StateStore
from tests.unit.test_executor import HOST, make_plan, up


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A home of its own: the per-user index lives there."""
    h = tmp_path / "home"
    h.mkdir()
    monkeypatch.setenv("HOME", str(h))
    return h


@pytest.fixture
def started(tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("KVPD_STATE_DIR", str(tmp_path / "state"))
    plan = make_plan(tmp_path / "run", [("kv", 0, "ok"), ("proxy", 1, "ok")], deployment="demo")
    t = LocalTransport()
    state = up(plan, {HOST: t}, store=StateStore(tmp_path / "state"))
    yield plan, state, t
    for r in state.processes:
        t.signal_group(r.pgid, 9, start_ticks=r.start_ticks)


def _record(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "run" / RECORD_FILE).read_text())


def _parse(plan, d: dict | bytes):
    raw = d if isinstance(d, bytes) else json.dumps(d).encode()
    return parse(raw, plan, HOST, "rec.json")


def test_up_writes_the_record_and_index(started, tmp_path: Path, home: Path) -> None:
    plan, state, _ = started
    path = tmp_path / "run" / RECORD_FILE
    assert path.stat().st_mode & 0o777 == 0o600
    d = _record(tmp_path)
    assert d["deployment"] == "demo"
    assert d["plan_digest"] == plan.profile_digest
    assert "@" in d["started_by"]
    assert d["kvpd_version"]
    by_name = {p["name"]: p for p in d["processes"]}
    kv = state.record("kv")
    assert by_name["kv"]["pid"] == kv.pid
    assert by_name["kv"]["start_ticks"] == kv.start_ticks
    assert by_name["kv"]["launch_digest"].startswith("sha256:")
    (index,) = (home / ".kvpd" / "deployments").glob("demo@*")
    assert index.read_text().strip() == str(tmp_path / "run")
    rec = _parse(plan, d)
    assert [p.name for p in rec.processes] == ["kv", "proxy"]


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda d: d["processes"][0].update(pgid=1), "pgid: 1 is not its own process group"),
        (lambda d: d["processes"][0].update(pid=1, pgid=1), "pid: 1 is not a process number"),
        (lambda d: d.update(deployment="other"), "another deployment's record, not 'demo'"),
        (lambda d: d["processes"][0].update(log="/etc/passwd"), "not its planned log"),
        (lambda d: d.update(run_dir="/"), "not the plan's run dir"),
        (lambda d: d["processes"][0].update(ports=[22]), "not the planned ports"),
        (lambda d: d["processes"][0].update(start_ticks="soon"), "not a /proc start time"),
        (lambda d: d["processes"][0].update(name="rm -rf"), "is not a process the plan runs"),
        (lambda d: d.update(command="sh -c evil"), "unknown fields ['command']"),
        (lambda d: d["processes"][0].update(status="zombie"), "not a process status"),
        (lambda d: d["processes"][0].update(stage=True), "the plan's stage is"),
    ],
)
def test_tampered_records_are_refused(started, tmp_path: Path, change, says: str) -> None:
    plan = started[0]
    d = _record(tmp_path)
    change(d)
    with pytest.raises(RecordRefused) as e:
        _parse(plan, d)
    assert says in str(e.value), str(e.value)
    assert "kvpd will not act on it (nothing was signalled)" in str(e.value)
    assert "Fix: if nothing of this deployment runs on local any more" in str(e.value)


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        (b"{not json", "not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (b"\xff\xfe", "not JSON"),
        (b" " * (MAX_RECORD_BYTES + 1), "more than a record ever holds"),
    ],
)
def test_garbage_and_oversize_are_refused(started, raw: bytes, says: str) -> None:
    with pytest.raises(RecordRefused, match=says):
        _parse(started[0], raw)


def test_a_tampered_record_kills_nothing(started, tmp_path: Path) -> None:
    """pgid 1 on the host: `down` from the profile refuses that host's record, signals none
    of its processes, and says so; the other processes of that record keep running."""
    plan, state, t = started
    d = _record(tmp_path)
    d["processes"][0]["pgid"] = 1
    (tmp_path / "run" / RECORD_FILE).write_text(json.dumps(d))
    with Deployments(transports={HOST: t}, grace_s=2) as svc:
        result = svc.down("demo", plan=plan)
    assert result is not None
    assert not result.clean
    assert result.refused
    assert "pgid: 1" in result.refused[0]
    assert all(t.alive(r.pid, start_ticks=r.start_ticks) for r in state.processes)


def test_wrong_start_time_is_left_alone(started, tmp_path: Path) -> None:
    """A record whose PID now is another process (start time differs): never signalled."""
    plan, _, t = started
    other = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        d = _record(tmp_path)
        d["processes"][0].update(pid=other.pid, pgid=other.pid)
        (tmp_path / "run" / RECORD_FILE).write_text(json.dumps(d))
        cur = read_current(plan, {HOST: t}, None)
        rec = cur.state.record("kv")
        assert rec is not None
        assert rec.pid == other.pid
        with Fanout(2) as pool:
            stopper = Stopper({HOST: t}, NullReporter(), pool, grace_s=1,
                              clock=time.monotonic, sleep=lambda s: None)  # fmt: skip
            outcome = stopper.stop([rec]).outcomes[0]
        assert outcome.how == "not running"
        assert "is another process now" in outcome.detail
        assert other.poll() is None  # alive: nothing was signalled
    finally:
        other.kill()
        other.wait()


def test_a_tampered_cache_is_no_better_than_a_record(started, tmp_path: Path) -> None:
    """The cache's records for a host that cannot be asked pass the same validation."""
    plan, state, t = started
    store = StateStore(tmp_path / "state")
    cache = store.load("demo")
    assert cache is not None
    cache.processes[0].pgid = 1

    class Down:
        host = HOST

        def __getattr__(self, name: str):
            raise OSError("host down")

    cur = read_current(plan, {HOST: Down()}, cache)  # type: ignore[dict-item]
    assert cur.unreachable
    assert cur.state.processes == []


def test_drift_names_the_processes(started, tmp_path: Path) -> None:
    import dataclasses

    plan, _, t = started
    kv = plan.process("kv")
    files = tuple(
        dataclasses.replace(f, content=f.content + "# edited\n") if f.path == kv.script else f
        for f in plan.files
    )
    edited = dataclasses.replace(plan, files=files, profile_digest="sha256:edited")
    cur = read_current(edited, {HOST: t}, None)
    assert cur.drift.processes == ["kv"]
    assert cur.drift.running_digests == ["sha256:test"]
    line = cur.drift.line(edited)
    assert "planned from a different profile (plan sha256:test" in line
    assert "processes launched differently: kv" in line


def test_down_removes_records_and_a_cache_catches_up(started, tmp_path: Path, home: Path) -> None:
    plan, state, t = started
    other_store = StateStore(tmp_path / "elsewhere")  # another controller: no cache at all
    with Deployments(other_store, transports={HOST: t}, grace_s=2) as svc:
        st, rows = svc.status("demo", plan=plan)
        assert [r.name for r in rows] == ["kv", "proxy"]
        assert all(r.alive for r in rows)
        assert svc.seen is not None
        assert svc.seen.unrecorded == []  # the records name them all
        assert svc.logs("kv", deployment="demo", plan=plan).text
        result = svc.down("demo", plan=plan)
    assert result is not None
    assert result.clean
    assert not (tmp_path / "run" / RECORD_FILE).exists()
    assert not list((home / ".kvpd" / "deployments").glob("demo@*"))
    with Deployments(StateStore(tmp_path / "state"), transports={HOST: t}) as svc:
        st, rows = svc.status("demo", plan=plan)  # the first controller's cache
    assert st.status == "down"
    assert rows
    assert not any(r.alive for r in rows)
    assert "stopped (no host records it any more)" in rows[0].detail
    assert StateStore(tmp_path / "state").require("demo").status == "down"


def test_down_with_no_record_left_still_stops_what_runs_in_the_run_dir(
    started, tmp_path: Path, home: Path
) -> None:
    """An `up` killed before any record was written: neither a record nor a cache names its
    processes, and `down` finds them by the deployment's environment in the plan's run dir."""
    plan, state, t = started
    (tmp_path / "run" / RECORD_FILE).unlink()
    with Deployments(StateStore(tmp_path / "elsewhere"), transports={HOST: t}, grace_s=2) as svc:
        st, rows = svc.status("demo", plan=plan)  # status names them too, apart from records
        assert rows == []
        assert svc.seen is not None
        found = sorted((r.name, r.host, r.pgid) for r in svc.seen.unrecorded)
        assert found == sorted((f"{r.name} (unrecorded)", HOST, r.pgid) for r in state.processes)
        lines = records_out.records_lines(plan, st, svc.seen)
        assert "demo: no host records a process of it, but some still run" in lines
        assert any(f"process group {state.processes[0].pgid} (kv)" in x
                   and "`kvpd down` with this profile stops it" in x for x in lines)  # fmt: skip
        assert {u["name"] for u in records_out.records_json(st, svc.seen)["unrecorded"]} == {
            "kv",
            "proxy",
        }
        result = svc.down("demo", plan=plan)
    assert result is not None
    assert sorted((o.name, o.how) for o in result.stop.outcomes) == [
        ("kv (unrecorded)", "stopped"),
        ("proxy (unrecorded)", "stopped"),
    ]
    assert not any(t.alive(r.pid, start_ticks=r.start_ticks) for r in state.processes)
    with Deployments(StateStore(tmp_path / "elsewhere"), transports={HOST: t}, grace_s=2) as svc:
        assert svc.down("demo", plan=plan) is None  # nothing left: nothing to stop


def test_conflicts_name_the_deployment_and_owner(started, tmp_path: Path) -> None:
    plan, state, t = started
    import dataclasses

    second = dataclasses.replace(plan, deployment="second")
    found = conflicts(second, {HOST: t})
    assert len(found) == 2
    assert all("of kvpd deployment 'demo' (started by " in f for f in found)
    assert any(f"ports {state.record('kv').ports[0]}" in f for f in found)
    assert "the run dir" in found[0]
    with Deployments(transports={HOST: t}) as svc, pytest.raises(StateError) as e:
        svc.refuse_conflicts(second)
    assert "up of 'second' refused before anything started" in str(e.value)
    assert "Stop that deployment first" in str(e.value)
    port = state.record("proxy").ports[0]
    assert "proxy of kvpd deployment 'demo' (started by " in port_holders(t, [port])[port]
    # The same deployment again: running already; the same name in another run dir (another
    # checkout): in the way through its ports only.
    again = conflicts(plan, {HOST: t})
    assert len(again) == 2
    assert all("already (deployment 'demo' (started by" in f for f in again)
    host = dataclasses.replace(plan.hosts[0], run_dir=str(tmp_path / "other"))
    elsewhere = conflicts(dataclasses.replace(plan, hosts=(host,)), {HOST: t})
    assert len(elsewhere) == 2
    assert all(f.startswith("local: ports ") for f in elsewhere)
    assert not any("run dir" in f or "already" in f for f in elsewhere)


def test_a_cache_whose_profile_changed_is_refused(tmp_path: Path, monkeypatch) -> None:
    from kvpd.cli import target
    from kvpd.exec.state import DeploymentState

    plan = make_plan(tmp_path / "run", [("kv", 0, "ok")], deployment="demo")
    prof = tmp_path / "p.yaml"
    prof.write_text("name: demo\n")
    store = StateStore(tmp_path / "state")
    st = DeploymentState("demo", "sha256:then", plan, recipe={"profile": str(prof)})
    store.save(st)
    monkeypatch.setattr(target, "build", lambda profile, **kw: plan)
    with pytest.raises(StateError, match="no longer plans what `up` started as 'demo'"):
        target.from_cache(store, "demo")
    st.recipe = {}
    store.save(st)
    with pytest.raises(StateError, match="does not say which profile started it"):
        target.from_cache(store, "demo")
    prof.chmod(0o666)
    st.recipe, st.profile_digest = {"profile": str(prof)}, plan.profile_digest
    store.save(st)
    with pytest.raises(StateError, match="writable by group or others"):
        target.from_cache(store, "demo")
    prof.chmod(0o600)
    assert target.from_cache(store, "demo") is plan


def test_hostio_reads_nothing_when_absent(tmp_path: Path) -> None:
    t = LocalTransport()
    assert hostio.read_raw(t, str(tmp_path / "none.json")) is None


def test_preflight_busy_port_names_the_kvpd_process(started) -> None:
    from kvpd.exec.preflight.run import busy_detail

    _, state, t = started
    port = state.record("kv").ports[0]
    detail = busy_detail(t, [port, 1])
    assert detail.startswith(f"in use: [{port}, 1] ({port} by kv of kvpd deployment 'demo'")
    assert "started by " in detail
    assert "; 1 by" not in detail
    assert "(1 by" not in detail


def test_status_lines_say_drift_refusals_and_stopped(started, tmp_path: Path) -> None:
    import dataclasses

    from kvpd.cli.records_out import records_json, records_lines

    plan, _, t = started
    edited = dataclasses.replace(plan, profile_digest="sha256:new")
    cur = read_current(edited, {HOST: t}, None)
    lines = records_lines(edited, cur.state, cur)
    assert lines[0].startswith("started by ")
    assert "(plan sha256:test)" in lines[0]
    assert "drift: what runs was planned from a different profile" in lines[1]
    assert records_json(cur.state, cur)["drift"]["running_plan_digests"] == ["sha256:test"]
    d = _record(tmp_path)
    d["processes"][0]["pgid"] = 1
    (tmp_path / "run" / RECORD_FILE).write_text(json.dumps(d))
    cur = read_current(plan, {HOST: t}, None)
    lines = records_lines(plan, cur.state, cur)
    assert lines == [f"refused: {cur.refused[HOST]}"]
    assert cur.state.processes == []
    (tmp_path / "run" / RECORD_FILE).unlink()
    cur = read_current(plan, {HOST: t}, None)
    assert records_lines(plan, cur.state, cur) == [
        "demo: stopped (no host records a process of it)"
    ]


def test_restart_refuses_drifted_missing_and_refused(started, tmp_path: Path) -> None:
    import dataclasses

    from kvpd.errors import DeployError
    from kvpd.exec.rolling import refuse_drifted

    plan, _, t = started
    kv = plan.process("kv")
    files = tuple(
        dataclasses.replace(f, content=f.content + "# edited\n") if f.path == kv.script else f
        for f in plan.files
    )
    edited = dataclasses.replace(plan, files=files)
    cur = read_current(edited, {HOST: t}, None)
    refuse_drifted([edited.process("proxy")], cur)  # launched as planned: fine
    with pytest.raises(DeployError, match="kv ran from a launch the profile given no longer"):
        refuse_drifted([edited.process("kv")], cur)
    cur.state.processes = [r for r in cur.state.processes if r.name != "proxy"]
    with pytest.raises(DeployError, match="no host records proxy"):
        refuse_drifted([edited.process("proxy")], cur)
    cur.refused = {HOST: "local: the host record ... pgid: 1"}
    with pytest.raises(DeployError, match="restart refused: local: the host record"):
        refuse_drifted([edited.process("proxy")], cur)


def test_a_cpu_hosts_cores_are_no_conflict_but_npus_are() -> None:
    """Two CPU deployments may bind the same cores; two deployments never share an NPU."""
    from kvpd.exec.records.conflicts import _exclusive_devices
    from kvpd.plan.value import HostSpec, Plan, ProcessSpec

    engine = ProcessSpec(name="decode-0", host="h", role="decode", stage=2, script="d.sh",
                         command=("vllm",), ports=(8000,), devices=(0, 1))  # fmt: skip
    for hardware, held in (("cpu", set()), ("a3", {0, 1})):
        plan = Plan("dep", "d", (HostSpec("h", "10.0.0.1", hardware=hardware),), (), (engine,))
        assert _exclusive_devices(plan, "h") == held
