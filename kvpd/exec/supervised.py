"""The controller's view of a supervised process: its status file on the host, read-only.

The supervisor (kvpd/supervisor.py) writes `<run dir>/supervise/<name>.json`; `kvpd status`
shows restarts and the last exit from it, `kvpd down` uses it to verify that the child is gone
with its supervisor.
"""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass
from typing import Any

from kvpd.exec.transport import Transport
from kvpd.plan.supervision import status_path


@dataclass(frozen=True)
class Supervised:
    supervisor_pid: int
    state: str  # starting | running | backoff | stopped | exited | failed
    restarts: int
    child_pid: int | None
    child_pgid: int | None
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
            state=str(d.get("state", "")),
            restarts=int(d.get("restarts", 0)),
            child_pid=d.get("child_pid"),
            child_pgid=d.get("child_pgid"),
            last_exit=last,
            gave_up=str(d.get("gave_up", "")),
        )


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
