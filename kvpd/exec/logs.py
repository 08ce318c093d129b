"""Reading a process's log on its host: the last lines, and what is appended afterwards."""

from __future__ import annotations

import posixpath
import time
from collections.abc import Callable, Iterator

from kvpd.errors import StateError
from kvpd.exec.transport import Transport
from kvpd.plan.value import ProcessSpec


def tail(t: Transport, path: str, lines: int, *, timeout_s: float = 30) -> str:
    """The last `lines` lines of `path`; StateError naming the host if it cannot be read."""
    r = t.run(["tail", "-n", str(int(lines)), path], timeout_s=timeout_s)
    if not r.ok:
        raise StateError(f"cannot read {path} on {t.host}: {r.stderr.strip()}")
    return r.stdout


def size(t: Transport, path: str) -> int:
    r = t.run(["stat", "-c", "%s", path], timeout_s=30)
    return int(r.stdout.strip()) if r.ok and r.stdout.strip().isdigit() else 0


def follow(
    t: Transport,
    path: str,
    *,
    interval_s: float = 0.5,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[str]:
    """What is appended to `path` from now on, chunk by chunk, until the caller stops; a
    truncated or replaced file is read again from its start."""
    offset = size(t, path)
    while True:
        sleep(interval_s)
        now = size(t, path)
        if now < offset:
            offset = 0
        if now > offset:  # exactly the bytes [offset, now): the file may grow meanwhile
            r = t.run(
                [
                    "dd",
                    f"if={path}",
                    "iflag=skip_bytes,count_bytes",
                    f"skip={offset}",
                    f"count={now - offset}",
                    "bs=65536",
                    "status=none",
                ],
                timeout_s=30,
            )
            if r.ok:
                yield r.stdout
            offset = now


def log_path(run_dir: str, spec: ProcessSpec) -> str:
    """Where a process's output goes on its host: its planned log file, or logs/NAME.log."""
    return posixpath.join(run_dir, spec.log or f"logs/{spec.name}.log")
