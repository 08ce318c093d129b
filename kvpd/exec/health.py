"""Health probes from the controller: one HTTP GET with a short timeout, never through a proxy."""

from __future__ import annotations

import urllib.error
import urllib.request
from dataclasses import dataclass

from kvpd.plan.value import HealthCheck

# Health URLs point at cluster nodes; an http_proxy from the environment must not apply.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass(frozen=True)
class ProbeResult:
    ok: bool
    detail: str  # "HTTP 200", "connection refused", "timed out after 2s", ...


def probe(check: HealthCheck, *, timeout_s: float = 2.0) -> ProbeResult:
    """GET `check.url` once; ok when the status equals `check.expect_status`. A check without
    a URL (a service without an HTTP endpoint) is never ok here: its port decides."""
    if not check.url:
        return ProbeResult(False, "no HTTP health endpoint")
    try:
        with _OPENER.open(check.url, timeout=timeout_s) as resp:
            status = resp.status
    except urllib.error.HTTPError as e:
        status = e.code
    except urllib.error.URLError as e:
        return ProbeResult(False, _reason(e.reason))
    except TimeoutError:
        return ProbeResult(False, f"timed out after {timeout_s:g}s")
    except (OSError, ValueError) as e:  # reset by peer, bad status line, malformed URL
        return ProbeResult(False, _reason(e))
    if status == check.expect_status:
        return ProbeResult(True, f"HTTP {status}")
    return ProbeResult(False, f"HTTP {status}, expected {check.expect_status}")


def _reason(reason: object) -> str:
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    if isinstance(reason, TimeoutError):
        return "timed out"
    if isinstance(reason, OSError) and reason.strerror:
        return reason.strerror.lower()
    return str(reason)
