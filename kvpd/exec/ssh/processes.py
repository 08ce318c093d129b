"""Process control through shell snippets (pure of paramiko): what every transport that runs
commands through a POSIX shell on the node shares, over SSH or inside a container.

A transport mixes in `ShellProcesses` and provides `_snippet(script, what)` (run one shell
snippet, return its stdout or raise TransportError naming `what`); identity, the PID-reuse
guard and port listing then follow the procfs rules once (kvpd.exec.procfs).
"""

from __future__ import annotations

from kvpd.errors import TransportError
from kvpd.exec import procfs
from kvpd.exec.ssh import commands
from kvpd.exec.transport import Started


class ShellProcesses:
    """alive / group_alive / signal_group / ports_listening over `_snippet`."""

    def _snippet(
        self, script: str, what: str, timeout_s: float = 30.0, *, idempotent: bool = False
    ) -> str:
        """`idempotent`: the snippet only reads, so it may be run again when the link to the
        host is lost while it runs."""
        raise NotImplementedError

    def _group(self, pgid: int) -> tuple[procfs.ProcStat | None, list[procfs.ProcStat]]:
        """(the process numbered `pgid` if any, the live members of process group `pgid`)."""
        out = self._snippet(
            commands.group_stats_snippet(pgid), f"listing process group {pgid}", idempotent=True
        )
        leader, members = None, []
        for line in out.splitlines():
            if line.startswith("L "):
                leader = procfs.parse_stat(line[2:])
            elif (st := procfs.parse_stat(line)) is not None:
                members.append(st)
        return leader, procfs.live_members(members, int(pgid))

    def alive(self, pid: int, *, start_ticks: int | None = None) -> bool:
        out = self._snippet(
            commands.stat_snippet(pid), f"reading the state of {pid}", idempotent=True
        )
        st = procfs.parse_stat(out) if out.strip() else None
        return procfs.is_alive(st, start_ticks)

    def group_alive(self, pgid: int) -> list[int]:
        return sorted(s.pid for s in self._group(pgid)[1])

    def signal_group(self, pgid: int, sig: int, *, start_ticks: int) -> bool:
        """Signal the group unless it can no longer be ours (procfs.may_signal_group); the
        snippet checks the leader's start time again just before the kill, so the window for
        PID reuse is the shell's, not a round trip."""
        leader, members = self._group(pgid)
        if not procfs.may_signal_group(int(pgid), leader, members, start_ticks):
            return False
        out = self._snippet(
            commands.signal_snippet(pgid, sig, start_ticks), f"signalling process group {pgid}"
        )
        return out.strip() == "sent"

    def ports_listening(self, ports: list[int]) -> list[int]:
        # Read where the processes run: a container without host networking shows its own.
        out = self._snippet(commands.LISTENING_SNIPPET, "listing listening ports", idempotent=True)
        listening = procfs.listening_in([out])
        return [p for p in ports if p in listening]


def started_pid(lines: list[str]) -> int | None:
    """The PID line of `detached_command_line`'s output (the only line of digits alone)."""
    return next((int(x) for x in lines if x.strip().isdigit()), None)


def started(lines: list[str], log_path: str) -> Started:
    """The process `detached_command_line` started, from its output: its PID on a line of its
    own and its stat line (for the start time that guards against PID reuse), as the process
    itself and the shell that started it printed them, in either order."""
    pid = started_pid(lines)
    if pid is None:
        raise TransportError("the host reported no PID for the process it started")
    if not procfs.signalable(pid):  # node output: kvpd would later signal this number's group
        raise TransportError(f"the host reported PID {pid} for the process it started")
    stats = (procfs.parse_stat(x) for x in lines if not x.strip().isdigit())
    ticks = next((st.start_ticks for st in stats if st is not None and st.pid == pid), 0)
    return Started(pid=pid, pgid=pid, start_ticks=ticks, log=log_path)
