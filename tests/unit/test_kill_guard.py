"""Every kill path acts only on a group kvpd started, verified by its leader's start time, and
never on pgid <= 1 or the controller's own group, whatever a node-side file says."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from types import SimpleNamespace

import pytest

from kvpd.exec.local import LocalTransport, read_stat
from kvpd.exec.processes.stop import StopResult
from kvpd.exec.processes.supervised import Supervised
from kvpd.exec.procfs import ProcStat, may_signal_group, signalable
from kvpd.exec.service import Deployments
from kvpd.exec.ssh import commands

TICKS = 5000


def _leader(pid: int, ticks: int = TICKS) -> ProcStat:
    return ProcStat(pid, "S", pid, pid, ticks)


@pytest.mark.parametrize("pgid", [1, 0, -1, -42])
def test_group_numbers_below_two_are_never_signalled(pgid: int) -> None:
    assert not signalable(pgid)
    assert not may_signal_group(pgid, _leader(pgid), [_leader(pgid)], TICKS)
    with pytest.raises(ValueError, match="refusing to signal"):
        commands.signal_snippet(pgid, 9, TICKS)
    with pytest.raises(ValueError, match="refusing to signal"):
        commands.kill_later_snippet(pgid, TICKS)


def test_an_identity_without_start_time_is_never_signalled() -> None:
    assert not may_signal_group(100, _leader(100), [_leader(100)], 0)
    with pytest.raises(ValueError):
        commands.kill_later_snippet(100, 0)


def test_the_controllers_own_group_is_refused() -> None:
    own = os.getpgrp()
    leader = read_stat(own)
    ticks = leader.start_ticks if leader is not None else TICKS
    assert not may_signal_group(own, _leader(own, ticks), [_leader(own, ticks)], ticks, own)
    assert not LocalTransport().signal_group(own, 0, start_ticks=ticks)


def _sleeper() -> tuple[subprocess.Popen[bytes], int]:
    proc = subprocess.Popen(["sleep", "30"], start_new_session=True)
    st = read_stat(proc.pid)
    assert st is not None
    return proc, st.start_ticks


def _run_sh(script: str) -> str:
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True).stdout.strip()


def test_shell_kill_snippets_check_the_start_time_just_before_the_kill() -> None:
    proc, ticks = _sleeper()
    try:
        assert _run_sh(commands.signal_snippet(proc.pid, 0, ticks + 1)) == "gone"
        _run_sh(commands.kill_later_snippet(proc.pid, ticks + 1))
        time.sleep(0.3)
        assert proc.poll() is None  # another start time: not ours, untouched
        assert _run_sh(commands.signal_snippet(proc.pid, 0, ticks)) == "sent"
        _run_sh(commands.kill_later_snippet(proc.pid, ticks))
        assert proc.wait(timeout=5) == -signal.SIGTERM
    finally:
        proc.kill()
        proc.wait()


def test_the_timed_out_command_identity_names_the_shell_and_its_start_time() -> None:
    out = subprocess.run(
        ["sh", "-c", commands.SELF_IDENTITY + 'echo "$#"'], capture_output=True, text=True
    )
    ident = commands.self_identity(out.stderr.splitlines()[0].encode())
    assert ident is not None
    assert ident[1] > 0
    assert out.stdout.strip() == "0"  # the positional parameters are left empty
    assert commands.self_identity(b"1 5000") is None  # a group number kvpd never signals
    assert commands.self_identity(b"4242") is None  # no start time: nothing is killed


def test_supervisor_status_fields_are_checked() -> None:
    sup = Supervised.from_dict({"supervisor_pid": 7, "child_pid": 1, "child_pgid": 1})
    assert sup.child_pid is None
    assert sup.child_pgid is None
    assert sup.child_start_ticks == 0
    odd = Supervised.from_dict({"child_pgid": -1, "child_pid": True, "child_start_ticks": "9"})
    assert odd.child_pgid is None
    assert odd.child_pid is None
    assert odd.child_start_ticks == 0
    assert Supervised.from_dict({"state": "failed"}).state == "failed"
    assert Supervised.from_dict({"state": "<b>evil</b>"}).state == ""  # not a supervisor state
    assert odd.state == ""


def _reap(t: LocalTransport, sup: Supervised) -> StopResult:
    state = SimpleNamespace(record=lambda name: SimpleNamespace(host="h"))
    result = SimpleNamespace(stop=StopResult())
    with Deployments(transports={"h": t}) as svc:
        svc._reap_children(state, {"p": sup}, result)  # type: ignore[arg-type]
    return result.stop


def _status(pid: int, ticks: int) -> Supervised:
    return Supervised.from_dict(
        {"supervisor_pid": 7, "child_pid": pid, "child_pgid": pid, "child_start_ticks": ticks}
    )


def test_down_does_not_kill_a_group_a_stale_status_file_names() -> None:
    proc, ticks = _sleeper()
    try:
        for stale in (
            _status(proc.pid, ticks + 1),  # the number now belongs to a later process
            Supervised.from_dict(
                {"supervisor_pid": 7, "child_pid": proc.pid, "child_pgid": proc.pid}
            ),
        ):
            stop = _reap(LocalTransport(), stale)
            assert proc.poll() is None, "a group kvpd did not start was killed"
            assert [o.how for o in stop.outcomes] == ["still running"]
            assert "not signalled" in stop.outcomes[0].detail
        assert [o.how for o in _reap(LocalTransport(), _status(proc.pid, ticks)).outcomes] == [
            "killed"
        ]
        assert proc.wait(timeout=5) == -signal.SIGKILL
    finally:
        proc.kill()
        proc.wait()


def test_a_start_reporting_pid_1_is_refused() -> None:
    from kvpd.errors import TransportError
    from kvpd.exec.ssh.processes import started

    with pytest.raises(TransportError, match="reported PID 1"):
        started(["1", "1 (init) S 0 1 1"], "/x.log")
