"""The /proc rules every transport shares (pure)."""

from __future__ import annotations

import pytest

from kvpd.exec.procfs import ProcStat, is_alive, listening_in, live_members, may_signal_group
from kvpd.exec.ssh.processes import ShellProcesses

TICKS = 5000


def st(pid: int, pgid: int = 100, *, sid: int = 100, ticks: int = TICKS, state: str = "S"):
    return ProcStat(pid, state, pgid, sid, ticks)


def test_alive_needs_the_same_start_time_and_no_zombie() -> None:
    assert is_alive(st(100), TICKS)
    assert is_alive(st(100))
    assert not is_alive(st(100, ticks=TICKS + 1), TICKS)  # the PID was reused
    assert not is_alive(st(100, state="Z"))
    assert not is_alive(None)


@pytest.mark.parametrize(
    ("leader", "members", "ok"),
    [
        (st(100), [st(100), st(101)], True),  # our leader lives
        (st(100, ticks=TICKS + 9), [st(100, ticks=TICKS + 9)], False),  # a foreign leader
        (st(100, state="Z"), [], False),  # only our zombie leader is left
        (st(100, state="Z"), [st(101, ticks=TICKS + 3)], True),  # its children live on
        (None, [st(101, ticks=TICKS + 3)], True),  # leader reaped, our children remain
        (None, [st(101, sid=7, ticks=TICKS + 3)], False),  # another session: not ours
        (None, [st(101, ticks=TICKS - 1)], False),  # older than our leader: not ours
        (None, [], False),  # nothing left
    ],
)
def test_pid_reuse_guard(leader: ProcStat | None, members: list[ProcStat], ok: bool) -> None:
    assert may_signal_group(100, leader, live_members(members, 100), TICKS) is ok


def test_listening_ports_from_tcp_tables() -> None:
    tcp = (
        "  sl  local_address rem_address   st tx_queue rx_queue\n"
        "   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000\n"  # 127.0.0.1:8080 LISTEN
        "   1: 0100007F:1F91 0100007F:C350 01 00000000:00000000\n"  # established
    )
    tcp6 = "   0: 00000000000000000000000000000000:0050 00000000000000000000000000000000:0000 0A\n"
    assert listening_in([tcp, tcp6, "garbage line 0A\n"]) == {8080, 80}


# A /proc/4242/stat line: group 4242, session 4242, started at tick 77.
_LEADER = "4242 (engine) S 1 4242 4242 " + " ".join(["0"] * 15) + " 77 0"


class _RecordedSnippets(ShellProcesses):
    """A host where process group 4242 (started at tick 77) runs: each snippet is recorded
    with whether it may be run again after a lost link."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, bool]] = []

    def _snippet(
        self, script: str, what: str, timeout_s: float = 30.0, *, idempotent: bool = False
    ) -> str:
        self.calls.append((what, idempotent))
        if what.startswith("listing process group"):
            return f"L {_LEADER}\n{_LEADER}\n"
        return "sent\n" if what.startswith("signalling") else _LEADER


def test_only_the_read_only_probes_may_run_again_after_a_lost_link() -> None:
    """`down` and `status` probe every process (its state, its group, the listening ports):
    those only read, so a link lost mid-probe is retried on a new connection; a signal, whose
    fate is then unknown, is never sent twice."""
    t = _RecordedSnippets()
    assert t.alive(4242, start_ticks=77)
    assert t.group_alive(4242) == [4242]
    assert t.ports_listening([8000]) == []
    assert t.signal_group(4242, 15, start_ticks=77)
    kinds = {what.split()[0]: idempotent for what, idempotent in t.calls}
    assert kinds == {"reading": True, "listing": True, "signalling": False}, t.calls
