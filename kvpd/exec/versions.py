"""Preflight: the versions of the KV services, which decide how `up` knows they are ready.

The MetaService serves HTTP `/health` on `ock.mmc.meta_service.metrics_url` from memcache-hybrid
1.3 (older builds read that key differently); the Mooncake master's `/health` is documented for
0.3.13. With an older or unknown build `up` still starts them: it falls back to "the service
port listens and the log has the ready line". These checks say which check each host gets.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from kvpd.exec.checks import Check
from kvpd.exec.transport import Transport
from kvpd.plan.value import Plan

# role -> the first version with the HTTP health endpoint
HTTP_HEALTH_SINCE = {"metaservice": (1, 3, 0), "mooncake": (0, 3, 13)}
_VERSION = re.compile(r"(\d+)\.(\d+)\.(\d+)")
_MEMCACHE_VERSION = "import importlib.metadata as m; print(m.version('memcache-hybrid'))"


def _parse(text: str) -> tuple[int, ...] | None:
    m = _VERSION.search(text)
    return tuple(int(x) for x in m.groups()) if m else None


def service_versions(
    plan: Plan, transports: Callable[[str], Transport], reached: set[str]
) -> list[Check]:
    """One informational check per KV service on a reached host: its version and the
    readiness check `up` will use."""
    checks: list[Check] = []
    for p in plan.processes:
        if p.role not in HTTP_HEALTH_SINCE or p.health is None or p.host not in reached:
            continue
        since = HTTP_HEALTH_SINCE[p.role]
        if p.role == "metaservice":
            argv, what = [p.command[0], "-c", _MEMCACHE_VERSION], "memcache-hybrid"
        else:
            argv, what = [p.command[0], "--version"], "mooncake_master"
        try:
            r = transports(p.host).run(argv, timeout_s=30)
            found = _parse(r.stdout + r.stderr) if r.ok or r.stdout else None
        except Exception:  # noqa: BLE001 - reachability is its own check
            found = None
        shown = ".".join(map(str, found)) if found else "unknown version"
        if found is not None and found >= since:
            detail = f"{what} {shown}: ready when GET {p.health.url} answers"
        else:
            detail = (
                f"{what} {shown}: /health is documented from "
                f"{'.'.join(map(str, since))}; `up` also accepts port {p.health.ready_port} "
                f"listening with {p.health.ready_log!r} in the log"
            )
        checks.append(Check(p.host, f"{what} health check", True, detail))
    return checks
