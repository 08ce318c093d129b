"""The listening sockets' backlog at shutdown: connections the kernel has completed but the event
loop has not accepted yet. Closing a listening socket resets them, and their clients, which had
already sent a request, see it cut (ECONNRESET) instead of a refused connection. So the proxy
accepts them first, closes the listener at once after, and serves them like any connection
accepted before."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable
from typing import Protocol


class _HasFileno(Protocol):
    def fileno(self) -> int: ...


def take_backlog(listeners: Iterable[_HasFileno]) -> list[socket.socket]:
    """Accept every connection waiting on `listeners` (the server's sockets, asyncio's or
    uvloop's wrappers) without blocking. Each is read through a duplicate of its descriptor,
    which is closed again here, so the server's own close() still closes the listener. The
    caller closes the server right after, with no await in between: a connection completing in
    that gap is the only one still reset."""
    taken: list[socket.socket] = []
    for listener in listeners:
        try:
            dup = socket.socket(fileno=os.dup(listener.fileno()))
        except OSError:
            continue  # already closed
        try:
            dup.setblocking(False)
            while True:
                try:
                    conn, _ = dup.accept()
                except (BlockingIOError, InterruptedError):
                    break
                except OSError:
                    break  # the listener failed: nothing more to take from it
                taken.append(conn)
        finally:
            dup.close()
    return taken
