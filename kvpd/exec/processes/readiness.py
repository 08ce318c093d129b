"""How `up` reads a process that is not healthy yet: a KV service without the HTTP health
endpoint (older builds) is ready by its port and log line, and a slow engine shows the last
line of its log while `up` waits ("still initialising")."""

from __future__ import annotations

from kvpd.exec import logs
from kvpd.exec.diagnose import causes as diagnose
from kvpd.exec.processes.health import ProbeResult
from kvpd.exec.transport import Transport
from kvpd.plan.value import HealthCheck

# After this long without health, `up` shows a process as still initialising, with the last
# line of its log (read at most every LOG_LINE_EVERY_S): sparse decode with a large host pool
# can take tens of minutes, and the log says whether it progresses.
STILL_INIT_AFTER_S = 30.0
LOG_LINE_EVERY_S = 10.0


def log_lines_due(
    waiting: list[tuple[str, float]], last_read: dict[str, float], now: float
) -> set[str]:
    """The waiting processes (name, start time) whose last log line to read now; records
    the reads in `last_read`."""
    due = {
        name
        for name, t0 in waiting
        if now - t0 >= STILL_INIT_AFTER_S
        and now - last_read.get(name, float("-inf")) >= LOG_LINE_EVERY_S
    }
    last_read.update((n, now) for n in due)
    return due


def ready_without_endpoint(t: Transport, health: HealthCheck, log: str) -> ProbeResult | None:
    """A build without the HTTP health endpoint is ready when its port listens and this
    start's part of its log has the ready line (the versions preflight says which builds).
    Where no ready line can be printed (`ready_log` empty: memcache at `log_level = error`)
    the port listening is the sign; the caller has checked that the process is alive."""
    if health.ready_port is None:
        return None
    if not t.ports_listening([health.ready_port]):
        return None
    if not health.ready_log:
        return ProbeResult(True, f"port {health.ready_port} listens and the process is alive")
    try:
        tail = logs.tail(t, log, 200, timeout_s=10)
    except Exception:  # noqa: BLE001 - no fallback then; the HTTP probe's answer stands
        return None
    if health.ready_log not in diagnose.current_run(tail):  # logs append across ups
        return None
    return ProbeResult(
        True, f"port {health.ready_port} listens and the log says {health.ready_log!r}"
    )


def last_log_line(t: Transport, log: str) -> str:
    """The last non-empty line of a log ("" when it cannot be read)."""
    try:
        tail = logs.tail(t, log, 5, timeout_s=10)
    except Exception:  # noqa: BLE001 - a progress line must never fail the wait
        return ""
    return next((ln.strip() for ln in reversed(tail.splitlines()) if ln.strip()), "")
