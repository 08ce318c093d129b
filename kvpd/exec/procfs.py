"""The process and socket rules every transport shares, as pure functions over /proc text.

Each transport only fetches text (the local one reads files, the SSH one runs a snippet, the
preflight probe embeds `listening_in` verbatim) and hands it here, so the PID-reuse guard and
the /proc/net/tcp format are written once.
"""

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class ProcStat:
    """The fields of /proc/<pid>/stat that kvpd uses."""

    pid: int
    state: str  # R, S, D, Z (zombie), X (dead), ...
    pgid: int
    sid: int
    start_ticks: int  # field 22: clock ticks after boot at which the process started

    @property
    def gone(self) -> bool:
        return self.state in ("Z", "X", "x")


def parse_stat(raw: str) -> ProcStat | None:
    """One /proc/<pid>/stat line; None if it is not one."""
    # The command name (field 2) is in parentheses and may itself contain spaces and ')'.
    head, sep, rest = raw.rpartition(")")
    if not sep:
        return None
    fields = rest.split()  # fields[0] is field 3 (state)
    try:
        return ProcStat(
            pid=int(head.split("(", 1)[0]),
            state=fields[0],
            pgid=int(fields[2]),
            sid=int(fields[3]),
            start_ticks=int(fields[19]),
        )
    except (IndexError, ValueError):
        return None


def listening_in(tables: "Iterable[str]") -> "set[int]":
    """Local ports in state LISTEN in the text of /proc/net/tcp and tcp6 (an iterable of table
    texts; header and foreign lines are skipped). Standard library only, annotations quoted: the
    preflight probe runs this very source on hosts with any python3."""
    ports = set()
    for text in tables:
        for line in text.splitlines():
            cols = line.split()
            if len(cols) > 3 and cols[3] == "0A":  # LISTEN (no module names: see above)
                try:
                    ports.add(int(cols[1].rsplit(":", 1)[1], 16))
                except (IndexError, ValueError):
                    continue
    return ports


def is_alive(st: ProcStat | None, start_ticks: int | None = None) -> bool:
    """The process exists, is not a zombie and (with `start_ticks`) is the one that was
    started, not a later process that reused its PID."""
    if st is None or st.gone:
        return False
    return start_ticks is None or st.start_ticks == start_ticks


def live_members(stats: Iterable[ProcStat], pgid: int) -> list[ProcStat]:
    """The non-zombie processes of process group `pgid`."""
    return [s for s in stats if s.pgid == pgid and not s.gone]


def signalable(pgid: int, own_pgid: int | None = None) -> bool:
    """Whether `pgid` may be named in a group signal at all: never 0 or 1 (`kill -9 -1` hits
    every process of the user, `kill -- -0` the caller's own group), never negative (a
    malformed number), never the caller's own process group."""
    return pgid > 1 and pgid != own_pgid


def may_signal_group(
    pgid: int,
    leader: ProcStat | None,
    members: list[ProcStat],
    start_ticks: int,
    own_pgid: int | None = None,
) -> bool:
    """Whether process group `pgid` can still be the one kvpd started (the PID-reuse guard).

    `leader` is the process numbered `pgid` (if any), `members` the live processes of the group,
    `start_ticks` the leader's start time recorded when kvpd started it: an identity without a
    start time (0 or less) is never signalled, nor is a group `signalable` refuses.
    While any member of a process group lives, the kernel does not hand out its number as a new
    PID. So if the leader's PID now belongs to a process with other start_ticks, our whole group
    is gone. If the leader has exited and been reaped while members live on (a common case: bash
    ran the engine as a child), the group is ours only when every remaining member is in session
    `pgid` (ours were started with setsid, so sid == pgid) and started no earlier than our
    leader; that rejects a foreign group that reused the number after ours ended, barring a
    wrap-around within one tick.
    """
    if not signalable(pgid, own_pgid) or start_ticks <= 0:
        return False
    if leader is not None:
        if leader.start_ticks != start_ticks:
            return False
        # Only the zombie leader is left: nothing to signal.
        return not (leader.gone and not members)
    if not members:
        return False
    return all(s.sid == pgid and s.start_ticks >= start_ticks for s in members)
