"""The event log of a deployment: `<state root>/<deployment>/events.jsonl`, append-only.

One JSON object per line (time, who, what, detail). Lines are only ever appended (O_APPEND,
one write per event), so concurrent kvpd commands never tear each other's lines, and a record
survives the deployment's state being rewritten or deleted by `down`.
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from kvpd.exec.local import private_dirs

EVENTS_FILE = "events.jsonl"
# What this kvpd records. A log read back may hold another kvpd's words too: `Event.what` of a
# read event is any text, shown as it is.
EventKind = Literal[
    "up", "up-failed", "canary", "down", "restart", "restart-failed", "supervisor-restart",
    "diagnose",
]  # fmt: skip


@dataclass(frozen=True)
class Event:
    at: float  # Unix time
    who: str  # user@host of the kvpd that acted
    what: str  # an EventKind when this kvpd wrote it
    detail: str = ""
    data: dict[str, Any] = field(default_factory=dict)


def who() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (containers)
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"


class EventLog:
    def __init__(self, root: Path, deployment: str) -> None:
        self.path = root / deployment / EVENTS_FILE

    def record(self, what: EventKind, detail: str = "", **data: Any) -> Event:
        ev = Event(time.time(), who(), what, detail, data)
        private_dirs(self.path.parent)
        line = (json.dumps(asdict(ev), sort_keys=True) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
        return ev

    def read(self, last: int | None = None) -> list[Event]:
        """The events in order (a torn or foreign line is skipped, never fatal)."""
        try:
            lines = self.path.read_text().splitlines()
        except FileNotFoundError:
            return []
        out = []
        for ln in lines:
            try:
                d = json.loads(ln)
                out.append(Event(float(d["at"]), str(d["who"]), str(d["what"]),
                                 str(d.get("detail", "")), dict(d.get("data") or {})))  # fmt: skip
            except (ValueError, KeyError, TypeError):
                continue
        return out[-last:] if last else out


def note_restarts(log: EventLog, name: str, restarts: int, last_exit: str) -> None:
    """Append a `supervisor-restart` event when `name`'s supervisor restarted it more often
    than the log knows since the last `up` (node-side restarts reach the log whenever kvpd
    looks: `status`, `down`, `diagnose`)."""
    known = 0
    for e in log.read():
        if e.what == "up":
            known = 0
        elif e.what == "supervisor-restart" and e.data.get("process") == name:
            known = int(e.data.get("restarts", 0))
    if restarts > known:
        log.record(
            "supervisor-restart",
            f"{name} restarted by its supervisor ({restarts} so far; last exit {last_exit})",
            process=name,
            restarts=restarts,
        )
