"""Health probes: one HTTP GET with a short timeout, through the transport of the process's
host (over SSH a channel of its connection: the controller needs no route to the port)."""

from __future__ import annotations

from dataclasses import dataclass

from kvpd.exec.http_wire import endpoint
from kvpd.exec.transport import ChannelError, Transport
from kvpd.plan.value import HealthCheck


@dataclass(frozen=True)
class ProbeResult:
    ok: bool
    detail: str  # "HTTP 200", "port 7800 refused (the SSH channel to p1 opened)", ...


def probe(t: Transport, check: HealthCheck, *, timeout_s: float = 2.0) -> ProbeResult:
    """GET `check.url` once from `t`'s host; ok when the status equals `check.expect_status`.
    A check without a URL (a service without an HTTP endpoint) is never ok here: its port
    decides."""
    if not check.url:
        return ProbeResult(False, "no HTTP health endpoint")
    try:
        req = endpoint(check.url).request(timeout_s=timeout_s)
    except ValueError as e:
        return ProbeResult(False, str(e))
    try:
        status = t.http(req).status
    except ChannelError as e:
        return ProbeResult(False, e.detail)
    if status == check.expect_status:
        return ProbeResult(True, f"HTTP {status}")
    return ProbeResult(False, f"HTTP {status}, expected {check.expect_status}")
