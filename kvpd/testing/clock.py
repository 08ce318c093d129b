"""Time for tests of code that waits: a fake clock and polling helpers, shared by the suite.

`FakeClock` stands in for the executor's `clock`/`sleep` pair: each sleep advances the clock by
the asked time at once, so a 600 s health deadline passes instantly. `pause_s` lets real work
(a process the test started) run a little per sleep.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable


class FakeClock:
    """Deadlines without waiting: `clock()` is the time, `clock.sleep(s)` advances it by s."""

    def __init__(self, pause_s: float = 0.0) -> None:
        self.now = 0.0
        self.pause_s = pause_s

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s
        if self.pause_s:
            time.sleep(self.pause_s)


def wait_for(cond: Callable[[], bool], timeout_s: float = 10.0, every_s: float = 0.02) -> bool:
    """Poll `cond` until it holds or `timeout_s` passes; its last answer."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(every_s)
    return cond()


def free_port() -> int:
    """A TCP port free on loopback right now (the kernel's choice)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
