"""Harnesses stop what they start on any exit: SIGTERM and SIGHUP act as Ctrl-C.

Python's default for SIGTERM (what `timeout`, a CI runner or `kill` sends) and SIGHUP (a closed
terminal) is to die at once: `finally` blocks and pytest's fixture teardowns never run, and the
engines, proxies and services a benchmark or an end-to-end test started keep running. With
`stop_on_termination()` both act as Ctrl-C does instead: KeyboardInterrupt in the main thread,
or, inside asyncio.run, the main task cancelled and KeyboardInterrupt raised once it has
unwound, so the same cleanup runs for all three. A second signal during that cleanup is
ignored: the cleanup is bounded (each stop waits a few seconds, then kills), and interrupting it
would leave the very processes it is stopping.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    for s in SIGNALS:
        signal.signal(s, signal.SIG_IGN)
    # Inside asyncio.run the SIGINT handler is the runner's: it cancels the main task, and run()
    # then raises KeyboardInterrupt once the task has unwound. That is what Ctrl-C does there,
    # and it is the only safe way: an exception raised here may land inside an event-loop
    # callback instead (a protocol's data_received), where uvloop reports it as a transport
    # error and drops it, and the coroutine awaiting that transport then waits forever.
    on_sigint = signal.getsignal(signal.SIGINT)
    if callable(on_sigint) and on_sigint is not signal.default_int_handler:
        on_sigint(signal.SIGINT, frame)
        return
    raise KeyboardInterrupt(f"stopped by signal {signal.Signals(signum).name}")


def stop_on_termination() -> None:
    """Make SIGTERM and SIGHUP raise KeyboardInterrupt (a no-op outside the main thread, where
    Python cannot install handlers)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for s in SIGNALS:
        signal.signal(s, _interrupt)
