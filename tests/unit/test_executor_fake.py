"""The executor on the scripted fake transport: no real processes, a fake clock, so deadlines,
rollbacks, stubborn processes and PID reuse are checked in milliseconds. The same paths run
for real in test_executor.py (local processes) and the e2e tests (SSH test bed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvpd.errors import DeployError, HealthTimeout, StateError
from kvpd.exec.executor import Executor
from kvpd.exec.state import StateStore
from kvpd.exec.transport import CommandResult
from kvpd.plan.value import FileSpec, HealthCheck, HostSpec, Plan, ProcessSpec
from kvpd.testing.clock import FakeClock
from kvpd.testing.transport import FakeProgram, FakeTransport

HOSTS = ("h1", "h2")


def plan(procs: list[tuple[str, str, int]], *, health: HealthCheck | None = None) -> Plan:
    """procs: (name, host, stage); every process runs its own script `<name>.sh`."""
    return Plan(
        deployment="fk",
        profile_digest="sha256:test",
        hosts=tuple(HostSpec(h, f"10.0.0.{i + 1}", run_dir="run") for i, h in enumerate(HOSTS)),
        files=tuple(FileSpec(host, f"{name}.sh", "exec engine\n") for name, host, _ in procs),
        processes=tuple(
            ProcessSpec(name, host, "prefill", stage, f"{name}.sh", ("engine",),
                        ports=(9000 + i,), health=health, log=f"logs/{name}.log")
            for i, (name, host, stage) in enumerate(procs)
        ),
    )  # fmt: skip


@pytest.fixture
def hosts() -> dict[str, FakeTransport]:
    fakes = {h: FakeTransport(h) for h in HOSTS}
    for i, f in enumerate(fakes.values()):
        for n in range(4):
            f.script(f"p{i}{n}.sh", FakeProgram(output=f"p{i}{n} up\n", ports=(9000 + 2 * n + i,)))
    return fakes


def executor(hosts: dict[str, FakeTransport], tmp_path: Path, **kw: Any) -> Executor:
    clock = FakeClock()
    return Executor(
        hosts, store=StateStore(tmp_path / "state"), clock=clock, sleep=clock.sleep, **kw
    )


PROCS = [("p00", "h1", 0), ("p10", "h2", 0), ("p01", "h1", 1), ("p11", "h2", 1)]


def test_up_writes_files_starts_stages_and_down_stops_all(hosts, tmp_path) -> None:
    ex = executor(hosts, tmp_path)
    state = ex.up(plan(PROCS))
    assert state.status == "up"
    assert [r.name for r in state.processes] == [
        "p00",
        "p10",
        "p01",
        "p11",
    ]
    assert hosts["h1"].read("run/p00.sh") == b"exec engine\n"
    assert b"=== kvpd: fk/p00 started" in hosts["h1"].read("run/logs/p00.log")
    assert all(r.status == "healthy" for r in state.processes)
    result = ex.down(state)
    assert result.clean
    assert all(o.how == "stopped" for o in result.stop.outcomes)
    assert all(not f.processes for f in hosts.values())
    assert ex.store.load("fk").status == "down"  # type: ignore[union-attr]


def test_second_up_is_refused_while_running(hosts, tmp_path) -> None:
    ex = executor(hosts, tmp_path)
    ex.up(plan(PROCS[:1]))
    with pytest.raises(StateError, match="already running"):
        ex.up(plan(PROCS[:1]))


def test_process_exiting_at_once_rolls_back_with_its_log(hosts, tmp_path) -> None:
    hosts["h2"].script(
        "p11.sh", FakeProgram(output="OSError: [Errno 98] Address already in use\n", exit_code=1)
    )
    ex = executor(hosts, tmp_path)
    with pytest.raises(DeployError) as e:
        ex.up(plan(PROCS))
    msg = str(e.value)
    assert "'p11' on host h2 exited before becoming healthy" in msg
    assert "Likely cause: port clash" in msg
    assert "| OSError: [Errno 98]" in msg
    assert "Everything this run started (4 processes) is stopped." in msg
    assert all(not f.processes for f in hosts.values())


def test_health_deadline_uses_the_clock(hosts, tmp_path) -> None:
    never = HealthCheck("http://127.0.0.1:9/health", timeout_s=600, interval_s=30)
    ex = executor(hosts, tmp_path, probe_timeout_s=0.2)
    with pytest.raises(HealthTimeout, match="did not become healthy within 600s"):
        ex.up(plan(PROCS[:1], health=never))
    assert not hosts["h1"].processes


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []

    def process(self, name: str, phase: str, *, host: str = "", detail: str = "",
                elapsed_s: float | None = None) -> None:  # fmt: skip
        self.events.append((name, phase, detail))

    def message(self, text: str) -> None:
        pass


def test_slow_start_shows_still_initialising_with_the_last_log_line(hosts, tmp_path) -> None:
    """A sparse decode setting up a large host pool answers /health after tens of minutes:
    while `up` waits it shows the process as still initialising with its log's last line."""
    hosts["h1"].script("p00.sh", FakeProgram(output="Allocating host pool 96/128 GiB\n"))
    never = HealthCheck("http://127.0.0.1:9/health", timeout_s=120, interval_s=10)
    rec = Recorder()
    ex = executor(hosts, tmp_path, probe_timeout_s=0.2, reporter=rec)
    with pytest.raises(HealthTimeout, match="within 120s"):
        ex.up(plan(PROCS[:1], health=never))
    init = [d for n, phase, d in rec.events if phase == "initialising"]
    assert init
    assert init[0] == "limit 120s; log: Allocating host pool 96/128 GiB"
    # before 30 s it is plain waiting; the log is read at most every 10 s
    assert rec.events.index(next(e for e in rec.events if e[1] == "initialising")) > 1
    assert len(init) <= 10


def test_service_without_a_health_endpoint_is_ready_by_port_and_log_line(hosts, tmp_path) -> None:
    """An older MetaService (memcache < 1.3) serves no HTTP /health: it is ready when its RPC
    port listens and its log says so, and not before the line is there."""
    ready = "Meta Service launched successfully"
    no_http = HealthCheck("http://127.0.0.1:9/health", timeout_s=60, interval_s=1,
                          ready_port=9000, ready_log=ready)  # fmt: skip
    hosts["h1"].script("p00.sh", FakeProgram(output=ready + "\n", ports=(9000,)))
    rec = Recorder()
    state = executor(hosts, tmp_path, probe_timeout_s=0.2, reporter=rec).up(
        plan(PROCS[:1], health=no_http)
    )
    assert state.status == "up"
    assert any(p == "healthy" and "port 9000 listens" in d for _, p, d in rec.events)
    hosts["h1"].script("p00.sh", FakeProgram(output="still loading\n", ports=(9000,)))
    with pytest.raises(HealthTimeout):
        executor(hosts, tmp_path / "b", probe_timeout_s=0.2).up(plan(PROCS[:1], health=no_http))


def test_metaservice_at_log_level_error_is_ready_by_its_port(hosts, tmp_path) -> None:
    """memcache 1.2 (no HTTP endpoint) at the guide's `log_level = error` (no ready line):
    ready when the meta port listens while the process lives."""
    no_http = HealthCheck("", timeout_s=60, interval_s=1, ready_port=9000)
    hosts["h1"].script("p00.sh", FakeProgram(output="", ports=(9000,)))
    rec = Recorder()
    state = executor(hosts, tmp_path, probe_timeout_s=0.2, reporter=rec).up(
        plan(PROCS[:1], health=no_http)
    )
    assert state.status == "up"
    assert any(p == "healthy" and "port 9000 listens and the process is alive" in d
               for _, p, d in rec.events)  # fmt: skip
    fresh = {h: FakeTransport(h) for h in HOSTS}
    fresh["h1"].script("p00.sh", FakeProgram(output="", ports=()))  # alive, never listens
    with pytest.raises(HealthTimeout):
        executor(fresh, tmp_path / "b", probe_timeout_s=0.2).up(plan(PROCS[:1], health=no_http))


def _versions(sets: list[str], installed: str) -> list[Any]:
    from kvpd.exec.preflight.versions import service_versions
    from kvpd.plan.build import load_plan

    p = load_plan("layerwise-sparse-1p1d", sets=sets)  # a MetaService on p1
    t = FakeTransport("p1")
    meta = p.process("metaservice")
    t.commands[meta.command[0].rsplit("/", 1)[-1]] = lambda self, argv: CommandResult(
        tuple(argv), 0, installed + "\n", ""
    )
    assert service_versions(p, lambda h: t, set()) == []
    return service_versions(p, lambda h: t, {"p1"})


def test_versions_preflight_says_which_readiness_check_a_service_gets() -> None:
    (c,) = _versions([], "1.2.1")  # the guide's release and log level
    assert c.ok
    assert "memcache-hybrid 1.2.1, rendered for 1.2" in c.detail
    assert "port 5000 listening while the process lives" in c.detail
    (c,) = _versions(["kv.memcache.log_level=info"], "1.3.0")
    assert c.ok
    assert "with 'Meta Service launched successfully' in the log" in c.detail
    assert 'set kv.memcache.version: "1.3" for HTTP /health' in c.detail
    (c,) = _versions(['kv.memcache.version="1.3"'], "1.3.0")
    assert c.ok
    assert "ready when GET http://" in c.detail


def test_versions_preflight_fails_a_1_3_config_on_a_1_2_build() -> None:
    (c,) = _versions(['kv.memcache.version="1.3"'], "1.2.1")
    assert not c.ok
    assert "does not accept ock.mmc.meta_service.metrics_url" in c.detail
    assert 'kv.memcache.version: "1.2"' in c.fix


def test_stubborn_process_is_killed_after_the_grace(hosts, tmp_path) -> None:
    hosts["h1"].script("p00.sh", FakeProgram(ports=(9000,), ignore_term=True))
    ex = executor(hosts, tmp_path, grace_s=20)
    state = ex.up(plan(PROCS[:1]))
    result = ex.down(state)
    assert [o.how for o in result.stop.outcomes] == ["killed"]
    assert result.clean


def test_down_never_signals_a_process_that_reused_the_pid(hosts, tmp_path) -> None:
    ex = executor(hosts, tmp_path)
    state = ex.up(plan(PROCS[:1]))
    foreign = hosts["h1"].reuse_pid(state.processes[0].pid)  # ours died, the PID was reused
    result = ex.down(state)
    assert [o.how for o in result.stop.outcomes] == ["not running"]
    assert hosts["h1"].processes[foreign.pid] is foreign


def test_unreachable_host_status_and_refusal(hosts, tmp_path) -> None:
    ex = executor(hosts, tmp_path)
    state = ex.up(plan(PROCS[:2]))
    hosts["h2"].unreachable = True
    rows = {r.name: r for r in ex.status(state)}
    assert rows["p00"].alive is True
    assert rows["p10"].alive is None
    assert "host unreachable" in rows["p10"].detail
    with pytest.raises(StateError, match="already running"):  # unknown counts as running
        ex.refuse_if_running("fk", "fk")
