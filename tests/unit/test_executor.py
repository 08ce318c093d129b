"""The executor with real local processes: tiny HTTP services written by the test, real Plans."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from kvpd.errors import DeployError, HealthTimeout, StateError
from kvpd.exec.executor import Executor
from kvpd.exec.local import LocalTransport, read_stat
from kvpd.exec.processes.status import ProcessStatus
from kvpd.exec.processes.stop import DownResult, is_running
from kvpd.exec.state import DeploymentState, StateStore
from kvpd.plan.value import FileSpec, HealthCheck, HostSpec, Plan, ProcessSpec
from kvpd.testing.clock import FakeClock, free_port

# The "service": modes via argv. `ok` serves /health 200; `never` answers 503 forever;
# `fail` prints a known error and exits 1; `stubborn` ignores SIGTERM; every mode appends its
# start to order.txt so the test can see the start order.
SERVICE = textwrap.dedent(
    """
    import http.server, signal, sys, time
    mode, name, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with open("order.txt", "a") as f:
        f.write(f"{name} {time.monotonic()}\\n")
    if mode == "fail":
        print("OSError: [Errno 98] Address already in use", flush=True)
        sys.exit(1)
    if mode == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    code = 503 if mode == "never" else 200
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(code if self.path == "/health" else 404)
            self.end_headers()
        def log_message(self, *a):
            pass
    print(f"{name} listening on {port}", flush=True)
    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
    """
)

HOST = "local"


def up(plan: Plan, transports: dict, *, profile: str = "", **kw: Any) -> DeploymentState:
    return Executor(transports, **kw).up(plan, profile=profile)


def down(state: DeploymentState | None, transports: dict, **kw: Any) -> DownResult:
    assert state is not None
    return Executor(transports, **kw).down(state)


def status(state: DeploymentState, transports: dict) -> list[ProcessStatus]:
    return Executor(transports).status(state)


def make_plan(
    run_dir: Path,
    procs: list[tuple[str, int, str]],
    *,
    deployment: str = "t",
    timeout_s: float = 20.0,
    interval_s: float = 0.05,
) -> Plan:
    """procs: (name, stage, mode). Each process gets its own port and script."""
    files = [FileSpec(HOST, "service.py", SERVICE)]
    specs = []
    for name, stage, mode in procs:
        port = free_port()
        script = f"{name}.sh"
        files.append(
            FileSpec(HOST, script, f"exec {sys.executable} service.py {mode} {name} {port}\n")
        )
        specs.append(
            ProcessSpec(
                name=name,
                host=HOST,
                role="proxy",
                stage=stage,
                script=script,
                command=("python", "service.py"),
                log=f"logs/{name}.log",
                ports=(port,),
                health=HealthCheck(
                    f"http://127.0.0.1:{port}/health", timeout_s=timeout_s, interval_s=interval_s
                ),
            )
        )
    return Plan(
        deployment=deployment,
        profile_digest="sha256:test",
        hosts=(HostSpec(HOST, "127.0.0.1", transport="local", run_dir=str(run_dir)),),
        files=tuple(files),
        processes=tuple(specs),
    )


@pytest.fixture
def env(tmp_path: Path):
    store = StateStore(tmp_path / "state")
    transports = {HOST: LocalTransport()}
    started: list[int] = []
    yield tmp_path, store, transports, started
    # Safety net: never leave a process behind, whatever a test did.
    for d in store.deployments():
        st = store.load(d)
        assert st is not None
        for r in st.processes:
            if transports[HOST].alive(r.pid, start_ticks=r.start_ticks):
                os.killpg(r.pgid, signal.SIGKILL)
    for pid in started:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def assert_nothing_running(store: StateStore, deployment: str, t: LocalTransport) -> None:
    st = store.load(deployment)
    assert st is not None
    for r in st.processes:
        assert not t.alive(r.pid), r
        assert t.group_alive(r.pgid) == [], r
        assert t.ports_listening(r.ports) == [], r


def test_up_orders_stages_and_down_stops_everything(env) -> None:
    tmp, store, transports, _ = env
    plan = make_plan(tmp / "run", [("svc-a", 0, "ok"), ("svc-b", 0, "ok"), ("proxy", 1, "ok")])
    state = up(plan, transports, store=store)
    assert state.status == "up"
    assert [r.status for r in state.processes] == ["healthy"] * 3
    # Stage 1 started only after both stage-0 processes were up (file order = start order).
    order = [ln.split()[0] for ln in (tmp / "run" / "order.txt").read_text().splitlines()]
    assert order[-1] == "proxy"
    assert set(order[:2]) == {"svc-a", "svc-b"}
    saved = store.load("t")
    assert saved is not None
    assert saved.plan == plan
    rec = saved.record("proxy")
    assert rec is not None
    assert Path(rec.log).is_absolute()
    assert rec.pgid == rec.pid
    assert all(s.alive and s.healthy for s in status(saved, transports))

    result = down(saved, transports, store=store, grace_s=5)
    assert result.clean
    assert not result.nothing_running
    names = [o.name for o in result.stop.outcomes]
    assert names[0] == "proxy"
    assert set(names[1:]) == {"svc-a", "svc-b"}
    assert_nothing_running(store, "t", transports[HOST])
    # Idempotent: the second down finds nothing running.
    again = down(store.load("t"), transports, store=store, grace_s=5)
    assert again.nothing_running
    assert again.clean


def test_failed_process_rolls_back_with_log_tail_and_cause(env) -> None:
    tmp, store, transports, _ = env
    plan = make_plan(
        tmp / "run",
        [("svc-a", 0, "ok"), ("prefill-0", 1, "ok"), ("decode-0", 1, "fail"), ("px", 2, "ok")],
        timeout_s=600,
    )
    with pytest.raises(DeployError) as ei:
        up(plan, transports, store=store, grace_s=5)
    msg = str(ei.value)
    assert not isinstance(ei.value, HealthTimeout)
    assert "'decode-0' on host local exited before becoming healthy" in msg
    assert "Likely cause: port clash" in msg
    assert "  | OSError: [Errno 98] Address already in use" in msg
    assert "is stopped" in msg
    st = store.load("t")
    assert st is not None
    assert st.status == "failed"
    assert {r.name for r in st.processes} == {"svc-a", "prefill-0", "decode-0"}  # not px
    assert st.record("decode-0").status == "failed"  # type: ignore[union-attr]
    assert_nothing_running(store, "t", transports[HOST])


def test_never_healthy_times_out_instantly_with_fake_clock(env) -> None:
    tmp, store, transports, _ = env
    plan = make_plan(tmp / "run", [("svc", 0, "never")], timeout_s=600, interval_s=30)

    clock = FakeClock(pause_s=0.01)  # each sleep lets the real service run a little
    ex = Executor(transports, store=store, clock=clock, sleep=clock.sleep, grace_s=5)
    with pytest.raises(HealthTimeout) as ei:
        ex.up(plan)
    assert "did not become healthy within 600s" in str(ei.value)
    assert "HTTP 503, expected 200" in str(ei.value)
    assert "svc listening on" in str(ei.value)  # the log tail
    assert_nothing_running(store, "t", transports[HOST])


def test_sigterm_ignored_needs_sigkill(env) -> None:
    tmp, store, transports, _ = env
    plan = make_plan(tmp / "run", [("stubborn", 0, "stubborn")])
    state = up(plan, transports, store=store)
    result = down(state, transports, store=store, grace_s=0.5)
    assert [o.how for o in result.stop.outcomes] == ["killed"]
    assert_nothing_running(store, "t", transports[HOST])


def test_refuses_second_up(env) -> None:
    tmp, store, transports, _ = env
    plan = make_plan(tmp / "run", [("svc", 0, "ok")])
    state = up(plan, transports, store=store, profile="profiles/x.yaml")
    with pytest.raises(StateError, match=r"already running .*kvpd down profiles/x.yaml"):
        up(plan, transports, store=store)
    down(state, transports, store=store, grace_s=5)
    # Once it is down, up works again (a fresh record replaces the old one).
    state2 = up(plan, transports, store=store)
    assert state2.processes[0].pid != state.processes[0].pid
    down(state2, transports, store=store, grace_s=5)


def test_pid_reuse_guard_leaves_foreign_process_alone(env) -> None:
    tmp, store, transports, started = env
    plan = make_plan(tmp / "run", [("svc", 0, "ok")])
    state = up(plan, transports, store=store)
    rec = state.processes[0]
    t = transports[HOST]
    # Pretend the recorded process was another one: same PID, other start time.
    rec.start_ticks -= 1
    assert not t.alive(rec.pid, start_ticks=rec.start_ticks)
    assert not t.signal_group(rec.pgid, signal.SIGTERM, start_ticks=rec.start_ticks)
    assert not is_running(t, rec)
    result = down(state, transports, store=store, grace_s=1)
    assert [o.how for o in result.stop.outcomes] == ["not running"]
    assert t.alive(rec.pid)  # untouched
    rec.start_ticks += 1
    assert not down(state, transports, store=store, grace_s=5).nothing_running
    assert not t.alive(rec.pid)


def test_down_after_up_killed_half_way(env, tmp_path: Path) -> None:
    tmp, store, transports, _ = env
    plan = make_plan(
        tmp / "run", [("kv", 0, "ok"), ("p", 1, "ok"), ("stuck", 1, "never")], timeout_s=600
    )
    (tmp / "plan.json").write_text(plan.to_json())
    code = textwrap.dedent(
        f"""
        import json
        from kvpd.exec.executor import Executor
        from kvpd.exec.local import LocalTransport
        from kvpd.exec.state import StateStore
        from kvpd.plan.value import Plan
        plan = Plan.from_dict(json.load(open({str(tmp / "plan.json")!r})))
        Executor({{"local": LocalTransport()}}, store=StateStore({str(store.root)!r})).up(plan)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # until stage 1 is recorded and being waited on
            st = store.load("t")
            if st is not None and len(st.processes) == 3:
                break
            time.sleep(0.05)
        else:
            pytest.fail("up did not reach stage 1")
        proc.send_signal(signal.SIGKILL)  # no rollback: the children are orphaned
        proc.wait()
        st = store.load("t")
        assert st is not None
        assert st.status == "starting"
        t = transports[HOST]
        assert all(is_running(t, r) for r in st.processes)
        result = down(st, transports, store=store, grace_s=5)
        assert result.clean
        assert {o.how for o in result.stop.outcomes} == {"stopped"}
        assert_nothing_running(store, "t", t)
        assert store.load("t").status == "down"  # type: ignore[union-attr]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_leader_exited_but_group_member_lives(env) -> None:
    tmp, store, transports, _ = env
    plan = make_plan(tmp / "run", [("svc", 0, "ok")])
    # The script backgrounds the service and exits: the leader dies, its child keeps the group.
    spec = plan.processes[0]
    port = spec.ports[0]
    script = f"{sys.executable} service.py ok svc {port} &\nsleep 0.2\n"
    files = tuple(FileSpec(HOST, f.path, script) if f.path == "svc.sh" else f for f in plan.files)
    spec2 = ProcessSpec(**{**spec.__dict__, "health": None})
    plan = Plan(**{**plan.__dict__, "files": files, "processes": (spec2,)})
    state = up(plan, transports, store=store)
    rec = state.processes[0]
    t = transports[HOST]
    deadline = time.monotonic() + 10
    while t.alive(rec.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not t.alive(rec.pid)
    assert t.group_alive(rec.pgid)
    assert is_running(t, rec)
    result = down(state, transports, store=store, grace_s=5)
    assert [o.how for o in result.stop.outcomes] == ["stopped"]
    assert t.group_alive(rec.pgid) == []


def test_state_file_is_plain_json(env) -> None:
    tmp, store, transports, _ = env
    plan = make_plan(tmp / "run", [("svc", 0, "ok")])
    state = up(plan, transports, store=store)
    raw = json.loads(store.path("t").read_text())
    assert raw["deployment"] == "t"
    assert raw["profile_digest"] == "sha256:test"
    r = raw["processes"][0]
    assert {"host", "pid", "pgid", "start_ticks", "ports", "log", "started_at", "status"} <= set(r)
    assert read_stat(r["pid"]).start_ticks == r["start_ticks"]  # type: ignore[union-attr]
    assert Plan.from_dict(raw["plan"]) == plan
    down(state, transports, store=store, grace_s=5)


def test_missing_executable_is_a_clear_failure_of_that_process(env) -> None:
    import dataclasses

    from kvpd.errors import DeployError

    tmp, store, transports, _ = env
    plan = make_plan(tmp / "run", [("svc-a", 0, "ok")])
    # the launch script names a command that does not exist on the host
    files = tuple(
        dataclasses.replace(f, content="exec /no/such/engine --serve\n")
        if f.path == "svc-a.sh"
        else f
        for f in plan.files
    )
    plan = dataclasses.replace(plan, files=files)
    with pytest.raises(DeployError) as e:
        up(plan, transports, store=store)
    msg = str(e.value)
    assert "svc-a" in msg
    assert "/no/such/engine" in msg
    assert_nothing_running(store, "t", transports[HOST])


def test_serial_up_starts_one_process_at_a_time(env) -> None:
    from kvpd.exec.executor import Executor

    tmp, store, transports, _ = env
    plan = make_plan(tmp / "run", [("svc-a", 0, "ok"), ("svc-b", 0, "ok"), ("proxy", 1, "ok")])
    state = Executor(transports, store=store, serial=True).up(plan)
    assert state.status == "up"
    order = [ln.split()[0] for ln in (tmp / "run" / "order.txt").read_text().splitlines()]
    assert order[-1] == "proxy"
    down(store.load("t"), transports, store=store, grace_s=5)
    assert_nothing_running(store, "t", transports[HOST])
