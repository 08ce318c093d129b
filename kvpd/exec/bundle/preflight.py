"""Preflight for the node bundle (read-only): what `kvpd up` will need on each host to install it.

Per slot of `Plan.bundle`: its Python found and >= 3.10, pip, free disk in the run dir; per
platform: where the native core comes from (the controller's own build, its cross-build, a
cached wheel, a host's build), else the NumPy fallback and why, which fails the check when a
process requires the native core (the kvpd sparse planner).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvpd.exec import cross_build
from kvpd.exec.bundle import wheel as wheels
from kvpd.exec.bundle.host import CHECK_SH, NODE_SCRIPT, json_lines, vet
from kvpd.exec.bundle.result import fix_hint
from kvpd.exec.fanout import Fanout
from kvpd.exec.preflight.checks import Check
from kvpd.exec.transport import Transport
from kvpd.plan.bundle import BundleUse
from kvpd.plan.value import Plan


def preflight_checks(plan: Plan, transports: Callable[[str], Transport]) -> list[Check]:
    """Read-only checks of what the bundle needs on each host (kvpd.exec.preflight.run's table):
    each slot's Python (found, >= 3.10, pip), free disk in the run dir, and per platform
    whether the native core can be had (else the NumPy fallback: a warning, or a failure when
    a process requires the native core)."""
    by_host: dict[str, list[BundleUse]] = {}
    for u in plan.bundle:
        by_host.setdefault(u.host, []).append(u)

    workers = max(1, min(16, len(by_host)))
    with Fanout(workers) as pool:
        reports = dict(
            zip(
                by_host,
                pool.map(lambda h: _facts(plan, transports, h, by_host[h]), by_host),
                strict=True,
            )
        )
    checks: list[Check] = []
    platforms: dict[str, dict[str, Any]] = {}
    local = wheels.local_platform()
    for host, uses in by_host.items():
        for u, rep in zip(uses, reports[host], strict=True):
            usable = _slot_checks(host, u, rep, checks)
            if not usable:
                continue
            p = platforms.setdefault(rep["platform"], {"hosts": [], "builders": [], "required": []})
            p["hosts"].append(host)
            if rep.get("compiler"):
                p["builders"].append(host)
            if u.native == "required":
                p["required"].append(host)
    builders = {h.name for h in plan.hosts if h.bundle_builder}
    cross = cross_build.buildable([p for p in platforms if p != local])
    for platform, p in sorted(platforms.items()):
        checks.append(_native_check(platform, p, local, builders, cross))
    return checks


def _facts(
    plan: Plan, transports: Callable[[str], Transport], host: str, uses: list[BundleUse]
) -> list[dict[str, Any]]:
    """The node script's facts of each slot of `host`, vetted. Reaching the host at all (its
    transport, its host key, its run dir) is part of the check: a host that cannot be reached
    is a failed check of its own, not an error that hides every other host's checks."""
    try:
        t = transports(host)
        run_dir = t.resolve(plan.host(host).run_dir)
        args = ["bash", "-c", CHECK_SH, "kvpd-bundle", run_dir, "-", NODE_SCRIPT, "facts"]
        for u in uses:
            args += [u.slot, u.python]
        r = t.run(args, timeout_s=120)
    except Exception as e:  # noqa: BLE001 - reported as a failed check
        return [{"slot": u.slot, "problem": f"host unreachable: {e}"} for u in uses]
    found = {d.get("slot"): d for d in json_lines(r.stdout)}
    return [
        vet(found[u.slot], u.slot)
        if u.slot in found
        else {"slot": u.slot, "problem": r.stderr[-200:]}
        for u in uses
    ]


def _slot_checks(host: str, u: BundleUse, rep: dict[str, Any], checks: list[Check]) -> bool:
    """One slot's Python, pip and disk checks into `checks`; whether its Python can take the
    bundle at all (then its platform counts for the native core)."""
    name = f"bundle python ({u.slot})"
    if rep.get("problem") and not rep.get("platform") and not rep.get("too_old"):
        checks.append(Check(host, name, False, f"{u.python}: {rep['problem']}", fix_hint(rep)))
        return False
    ok = not rep.get("too_old")
    detail = f"{rep.get('executable')} {rep.get('version')}"
    checks.append(Check(host, name, ok, detail, "" if ok else fix_hint(rep)))
    if not ok:
        return False
    pip = bool(rep.get("pip"))
    checks.append(
        Check(
            host,
            f"pip ({u.slot})",
            pip,
            "found" if pip else f"no pip for {rep.get('executable')}",
            "" if pip else f"{rep.get('executable')} -m ensurepip (or install python3-pip)",
        )
    )
    free = rep.get("free_bytes") or 0
    need = 200 << 20
    checks.append(
        Check(
            host,
            f"disk for bundle ({u.slot})",
            free >= need,
            f"{free / (1 << 30):.1f} GiB free in the run dir",
            "" if free >= need else "free 200 MiB in the run dir's filesystem",
        )
    )
    return True


def _cached_hosts(platform: str, hosts: list[str], builders: set[str]) -> dict[str, str]:
    """Host -> the host whose cached native build of this kvpd `up` will give it: its own, else
    a `bundle_builder`'s (the only builds shared between hosts)."""
    shared = [b for b in sorted(builders) if _cached_native(platform, b)]
    out = {}
    for h in hosts:
        if _cached_native(platform, h):
            out[h] = h
        elif shared:
            out[h] = shared[0]
    return out


def _cached_native(platform: str, host: str) -> bool:
    w = wheels.cached(platform, built_on=host)
    return w is not None and w.native


def _cross_missing(platform: str) -> str:
    """Why a platform the controller could cross-build for has no cross-build ("" if none
    applies): the cross toolchain's absence, and how to install it."""
    target = cross_build.platform_target(platform)
    if target is None:
        return ""
    why = cross_build.find_toolchain(*target)
    return why if isinstance(why, str) else ""


def _native_check(
    platform: str,
    p: dict[str, Any],
    local: str,
    builders: set[str],
    cross: frozenset[str] = frozenset(),
) -> Check:
    """Where the wheel of one platform's hosts will come from, and whether they get the native
    core: the controller's build, its cross-build (aarch64, with the cross toolchain), a cached
    wheel (the host's own earlier build, or a `bundle_builder`'s), a `bundle_builder` host's
    build (for all of them), else each host with a compiler builds its own and the others get
    the NumPy fallback, with the reason."""
    hosts = list(dict.fromkeys(p["hosts"]))
    name = f"native core {platform}"
    if platform == local:
        return Check("*", name, True, f"controller build ({', '.join(hosts)})")
    if platform in cross:
        return Check("*", name, True, f"controller cross-build ({', '.join(hosts)})")
    cached = _cached_hosts(platform, hosts, builders)
    parts = [f"cached wheel built on {b} for {h}" for h, b in cached.items()]
    hosts = [h for h in hosts if h not in cached]
    able = [h for h in p["builders"] if h in builders]
    if able and hosts:
        parts.append(f"host build on {able[0]} for {', '.join(hosts)}")
        hosts = []
    own = [h for h in hosts if h in p["builders"]]
    if own:
        parts.append(f"host build on each of {', '.join(own)} for itself")
    left = [h for h in hosts if h not in own]
    if not left:
        return Check("*", name, True, "; ".join(parts))
    return _fallback_check(platform, name, p, parts, own, left)


def _fallback_check(
    platform: str, name: str, p: dict[str, Any], parts: list[str], own: list[str], left: list[str]
) -> Check:
    required = any(h in p["required"] for h in left)
    no_cross = _cross_missing(platform)
    fallback = f"warning: no compiler on {', '.join(left)}: NumPy fallback" + (
        " but the kvpd planner requires the native core" if required else ""
    )
    if no_cross:
        fallback += f" (no controller cross-build: {no_cross.split(';')[0]})"
    fix = "install g++ and the Python headers (python3-dev) on them"
    if no_cross:
        fix = f"{cross_build.INSTALL_HINT}; or {fix}"
    if own:
        fix += f", or set `bundle_builder: true` on {own[0]} so its build serves them"
    return Check("*", name, not required, "; ".join([*parts, fallback]), fix)
