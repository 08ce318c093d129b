"""The /proc rules every transport shares (pure)."""

from __future__ import annotations

import pytest

from kvpd.exec.procfs import ProcStat, is_alive, listening_in, live_members, may_signal_group

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
