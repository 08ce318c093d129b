"""`down` and a failed `up`'s rollback stop the sessions of a deployment that no record names
(kvpd.exec.processes.sweep), on the scripted fake: a start an `up` was killed during, a start
whose answer was lost. What the host lists is checked against real /proc in
test_transport_contract.py (local, containers, SSH)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvpd.errors import DeployError, TransportError
from kvpd.exec.processes import sweep
from kvpd.exec.procfs import ProcStat
from kvpd.exec.transport import Started
from kvpd.testing.transport import FakeProgram, FakeTransport
from tests.unit.test_executor_fake import PROCS, executor, plan

MARKS = {sweep.DEPLOYMENT_ENV: "fk", sweep.PROCESS_ENV: "p01"}


@pytest.fixture
def hosts() -> dict[str, FakeTransport]:
    fakes = {h: FakeTransport(h) for h in ("h1", "h2")}
    for i, f in enumerate(fakes.values()):
        f.script("engine", FakeProgram(output="up\n"))
        for n in range(2):
            f.script(f"p{i}{n}.sh", FakeProgram(output="up\n", ports=(9000 + 2 * n + i,)))
    return fakes


def test_down_stops_a_session_that_no_record_names(hosts, tmp_path) -> None:
    ex = executor(hosts, tmp_path)
    state = ex.up(plan(PROCS[:1]))
    # what an `up` SIGKILLed between a start and its record leaves on h1
    lost = hosts["h1"].start_detached(["engine"], log="run/x.log", cwd="run", env=MARKS)
    result = ex.down(state)
    assert [(o.name, o.how) for o in result.stop.outcomes] == [
        ("p00", "stopped"),
        ("p01 (unrecorded)", "stopped"),
    ]
    assert result.clean
    assert lost.pid not in hosts["h1"].processes
    assert not any(f.processes for f in hosts.values())


def test_down_leaves_what_lacks_either_mark(hosts, tmp_path) -> None:
    ex = executor(hosts, tmp_path)
    state = ex.up(plan(PROCS[:1]))
    h1 = hosts["h1"]
    kept = [
        h1.start_detached(["engine"], log="x.log", cwd="elsewhere", env=MARKS),
        h1.start_detached(
            ["engine"], log="x.log", cwd="run", env={**MARKS, sweep.DEPLOYMENT_ENV: "other"}
        ),
        h1.start_detached(["engine"], log="x.log", cwd="run"),
    ]
    result = ex.down(state)
    assert [o.name for o in result.stop.outcomes] == ["p00"]
    assert sorted(h1.processes) == sorted(s.pid for s in kept)


def test_rollback_stops_a_start_whose_answer_was_lost(
    hosts, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h2 = hosts["h2"]
    real = h2.start_detached

    def lost_answer(argv: list[str], **kw: Any) -> Started:
        real(argv, **kw)  # the host started it, the controller never heard
        raise TransportError("host h2: starting 'bash' failed (timed out)")

    monkeypatch.setattr(h2, "start_detached", lost_answer)
    ex = executor(hosts, tmp_path)
    with pytest.raises(DeployError, match="p10"):
        ex.up(plan(PROCS[:2]))
    assert not any(f.processes for f in hosts.values())


def test_a_host_that_cannot_be_asked_is_named_not_fatal(hosts, tmp_path) -> None:
    ex = executor(hosts, tmp_path)
    state = ex.up(plan(PROCS[:1]))
    hosts["h1"].commands.pop("sh")  # h1 runs no shell now: its other sessions stay unknown
    messages: list[str] = []
    ex.reporter.message = messages.append  # type: ignore[method-assign]
    assert ex.down(state).clean
    assert any(m.startswith("h1: could not look for processes no record names") for m in messages)


def stat(pid: int, pgid: int, sid: int, ticks: int, state: str = "S") -> ProcStat:
    return ProcStat(pid, state, pgid, sid, ticks)


def test_listing_from_the_host_is_checked() -> None:
    out = (
        "prefill-0\t41 (vllm serve) S 1 41 41 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 500 0\n"
        "$(reboot)\t42 (x) S 1 42 42 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 600 0\n"
        "no tab here\n"
        "d-0\tnot a stat line\n"
    )
    assert sweep.parse_listing(out) == [
        sweep.Marked("prefill-0", stat(41, 41, 41, 500)),
        sweep.Marked("?", stat(42, 42, 42, 600)),
    ]


def test_sessions_become_records_by_group() -> None:
    marked = [
        sweep.Marked("a", stat(10, 10, 10, 100)),  # a leader and its child
        sweep.Marked("a", stat(11, 10, 10, 105)),
        sweep.Marked("b", stat(21, 20, 20, 210)),  # a group whose leader exited
        sweep.Marked("b", stat(22, 20, 20, 205)),
        sweep.Marked("c", stat(31, 30, 7, 300)),  # not a session of its own: not ours
        sweep.Marked("d", stat(40, 40, 40, 400)),  # a recorded group: the records' stop
        sweep.Marked("e", stat(1, 1, 1, 1)),  # never group 1
    ]
    recs = sweep.unrecorded("h1", marked, {40}, stage=3)
    assert [(r.name, r.pid, r.pgid, r.start_ticks, r.stage) for r in recs] == [
        ("a (unrecorded)", 10, 10, 100, 3),
        ("b (unrecorded)", 20, 20, 205, 3),
    ]


def test_a_leaderless_group_is_signalled_only_while_its_members_are_ours(tmp_path: Path) -> None:
    """The record of a group whose leader exited carries its members' earliest start time: the
    PID-reuse guard (procfs.may_signal_group) then accepts the group, and refuses it once a
    process that started before them joins it."""
    from kvpd.exec import procfs

    members = [stat(21, 20, 20, 210), stat(22, 20, 20, 205)]
    (rec,) = sweep.unrecorded("h1", [sweep.Marked("b", m) for m in members], set(), 0)
    assert procfs.may_signal_group(20, None, members, rec.start_ticks)
    assert not procfs.may_signal_group(20, None, [*members, stat(23, 20, 20, 9)], rec.start_ticks)
