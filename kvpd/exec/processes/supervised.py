"""The controller's view of a supervised process: its status file on the host, read-only.

The supervisor (kvpd/supervisor.py) writes `<run dir>/supervise/<name>.json`; `kvpd status`
shows restarts and the last exit from it, `kvpd down` uses it to verify that the child is gone
with its supervisor.
"""

from __future__ import annotations

import json
import posixpath
import signal
import time
from dataclasses import dataclass
from typing import Any, Literal, get_args

from kvpd.exec.processes.stop import KILL_WAIT_S, POLL_S, StopHow, StopOutcome
from kvpd.exec.transport import Transport
from kvpd.plan.supervision import status_path

# What kvpd/supervisor.py writes as its "state"; "" when the file names none of them (it is
# node output, read as untrusted).
SupervisorState = Literal["starting", "running", "backoff", "stopped", "exited", "failed", ""]


@dataclass(frozen=True)
class Supervised:
    supervisor_pid: int
    state: SupervisorState
    restarts: int
    child_pid: int | None
    child_pgid: int | None
    child_start_ticks: int  # 0: not recorded (then kvpd never signals the child's group)
    last_exit: str  # "code 1", "signal SIGKILL", "" when it never exited
    gave_up: str

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Supervised:
        ex = d.get("last_exit") or {}
        last = f"signal {ex['signal']}" if ex.get("signal") else (
            f"code {ex['code']}" if ex.get("code") is not None else ""
        )  # fmt: skip
        return cls(
            supervisor_pid=int(d.get("supervisor_pid", 0)),
            state=_state(d.get("state")),
            restarts=int(d.get("restarts", 0)),
            child_pid=_process_number(d.get("child_pid")),
            child_pgid=_process_number(d.get("child_pgid")),
            child_start_ticks=_ticks(d.get("child_start_ticks")),
            last_exit=last,
            gave_up=str(d.get("gave_up", "")),
        )


def _process_number(v: object) -> int | None:
    """A PID or PGID from the node's file: an int > 1, else None (the file is node output, and
    0, 1 or a negative number named in a kill would hit far more than one process group)."""
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 1 else None


def _state(v: object) -> SupervisorState:
    return next((s for s in get_args(SupervisorState) if s == v), "")


def _ticks(v: object) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else 0


def read(t: Transport, run_dir: str, name: str, pid: int | None = None) -> Supervised | None:
    """The status of `name`'s supervisor, or None when it is not supervised (no file, or the
    file of an earlier run: its supervisor is not `pid`)."""
    try:
        raw = t.read(posixpath.join(run_dir, status_path(name)))
    except (OSError, Exception):  # noqa: BLE001 - absent or unreadable: not supervised
        return None
    try:
        sup = Supervised.from_dict(json.loads(raw))
    except (ValueError, TypeError, KeyError):
        return None
    return sup if pid is None or sup.supervisor_pid == pid else None


def reap_child(t: Transport, name: str, host: str, sup: Supervised) -> StopOutcome | None:
    """After `name`'s supervisor was stopped: kill its child's group if it outlived it (a
    supervisor killed past its grace leaves it to the kernel's PDEATHSIG, which does not reach
    the engine's own children). None when nothing of it is left. The group is signalled only
    as the process the supervisor started (its recorded start time): the status file is node
    output, and a stale or forged one must not name another group."""
    # The supervisor makes its child a session and group leader, so pid == pgid; a file
    # that says otherwise is not one kvpd's supervisor wrote.
    pgid = sup.child_pgid
    if pgid is None or pgid != sup.child_pid or not t.group_alive(pgid):
        return None
    detail = f"supervised child pgid {pgid} outlived its supervisor"
    if t.signal_group(pgid, signal.SIGKILL, start_ticks=sup.child_start_ticks):
        deadline = time.monotonic() + KILL_WAIT_S
        while t.group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(POLL_S)
    else:
        detail += (
            "; not signalled: it is not the process the supervisor started (its start time "
            "differs or was not recorded). Fix: check the group on the host and stop it by "
            "hand if it is kvpd's"
        )
    how: StopHow = "still running" if t.group_alive(pgid) else "killed"
    return StopOutcome(f"{name} (child)", host, how, detail)
