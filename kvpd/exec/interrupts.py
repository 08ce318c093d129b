"""Signals turned into the exceptions the executor already handles."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM (e.g. a CI timeout) takes the same path as Ctrl-C: `up` rolls back, then the
    exception propagates. Signal handlers can only be set from the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)
