"""Preflight: the versions of the KV services, which decide how `up` knows they are ready.

The MetaService serves HTTP `/health` on `ock.mmc.meta_service.metrics_url` from memcache-hybrid
1.3; a plan for 1.2 (`kv.memcache.version`, the guide's release) renders no such key and waits
for the meta port (kvpd/plan/memcache_compat.py). A 1.3 plan on an older build fails here, since
that build refuses the key. The Mooncake master's `/health` is documented for
0.3.13. With an older or unknown build `up` still starts them: it falls back to "the service
port listens and the log has the ready line". These checks say which check each host gets.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from kvpd.exec.preflight.checks import Check
from kvpd.exec.transport import Transport
from kvpd.plan.value import HealthCheck, Plan
from kvpd.profile.roles import Role

# role -> the first version with the HTTP health endpoint
HTTP_HEALTH_SINCE = {Role.METASERVICE: (1, 3, 0), Role.MOONCAKE: (0, 3, 13)}
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
        if p.role == Role.METASERVICE:
            argv, what = [p.command[0], "-c", _MEMCACHE_VERSION], "memcache-hybrid"
        else:
            argv, what = [p.command[0], "--version"], "mooncake_master"
        try:
            r = transports(p.host).run(argv, timeout_s=30)
            found = _parse(r.stdout + r.stderr) if r.ok or r.stdout else None
        except Exception:  # noqa: BLE001 - reachability is its own check
            found = None
        checks.append(_judge(p.host, p.role, what, found, p.health, since))
    return checks


def _judge(
    host: str, role: Role, what: str, found: tuple[int, ...] | None, h: HealthCheck,
    since: tuple[int, ...],
) -> Check:  # fmt: skip
    shown = ".".join(map(str, found)) if found else "unknown version"
    name = f"{what} health check"
    if role == Role.METASERVICE and not h.url:  # rendered for 1.2: no metrics_url, no /health
        how = f"port {h.ready_port} listening" + (
            f" with {h.ready_log!r} in the log" if h.ready_log else " while the process lives"
        )
        more = (
            "; set kv.memcache.version: \"1.3\" for HTTP /health"
            if found is not None and found >= since else ""
        )  # fmt: skip
        return Check(host, name, True, f"{what} {shown}, rendered for 1.2: ready when {how}{more}")
    if found is not None and found >= since:
        return Check(host, name, True, f"{what} {shown}: ready when GET {h.url} answers")
    if role == Role.METASERVICE and found is not None:  # 1.3 keys rendered for an older build
        return Check(
            host, name, False,
            f"{what} {shown} does not accept ock.mmc.meta_service.metrics_url, which "
            "kv.memcache.version 1.3 renders into mmc-meta.conf",
            'set kv.memcache.version: "1.2" in the profile, or install memcache-hybrid 1.3',
        )  # fmt: skip
    return Check(
        host, name, True,
        f"{what} {shown}: /health is documented from {'.'.join(map(str, since))}; `up` also "
        f"accepts port {h.ready_port} listening with {h.ready_log!r} in the log",
    )  # fmt: skip
