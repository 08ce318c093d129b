"""The bundle step of `kvpd up`: put kvpd on every host slot of `Plan.bundle`, verified.

One round trip per host checks every slot (`bundle/node.py check` in the slot's Python): a slot
that already holds this kvpd for its platform is verified and kept, so a second `up` costs one
check per host. For the others, one wheel per platform: the controller's own build where the
platform is the controller's, else a cached one, else one built on a host of that platform that
has a compiler, else the wheel without the native core (NumPy fallback; an error when a process
requires the native core). A host's build serves only that host unless the profile makes it a
`bundle_builder` (then it serves every host of its platform); it is verified and packed again on
the controller before it is cached or installed (kvpd.exec.bundle.host). Each wheel is then
installed with the slot's own pip into `<run dir>/bundle/<digest>/` and verified the same way.
Hosts run in parallel.

Nothing here writes outside `<run dir>/bundle` on a host, and nothing touches the user's Python
environments: pip runs with `--target`.
"""

from __future__ import annotations

import posixpath
import time
from collections.abc import Callable
from typing import Any

from kvpd.exec import cross_build
from kvpd.exec.bundle import wheel as wheels
from kvpd.exec.bundle.builds import Build as Build
from kvpd.exec.bundle.builds import Group
from kvpd.exec.bundle.builds import choose_builds as choose_builds
from kvpd.exec.bundle.host import CHECK_SH, NODE_SCRIPT, build_on, json_lines, origin, vet
from kvpd.exec.bundle.result import BundleSlot, SlotResult
from kvpd.exec.bundle.run import InstallRun
from kvpd.exec.bundle.run import fallback as fallback
from kvpd.exec.bundle.wheel_trust import platform_ok
from kvpd.exec.pool import TransportPool
from kvpd.exec.report import NullReporter, Phase, Reporter
from kvpd.exec.transport import Transport
from kvpd.plan.bundle import BUNDLE_DIR, BundleUse
from kvpd.plan.value import Plan


class BundleInstaller:
    def __init__(
        self,
        transports: Callable[[str], Transport],
        reporter: Reporter | None = None,
        *,
        max_workers: int = 16,
        build_local: Callable[..., wheels.Wheel] = wheels.build_local,
        local_platform: str | None = None,
        build_cross: Callable[[str], wheels.Wheel | str] = wheels.build_cross,
    ) -> None:
        self.transports = transports
        self.reporter = reporter or NullReporter()
        self.max_workers = max_workers
        self.build_local = build_local
        self.build_cross = build_cross
        self.local_platform = local_platform or wheels.local_platform()
        self.warnings: list[str] = []
        self.builders: set[str] = set()  # hosts whose builds may serve their whole platform
        self.executables: dict[str, str] = {}  # host -> a Python it reported (to build with)

    def _say(self, host: str, phase: Phase, detail: str = "", t0: float | None = None) -> None:
        elapsed = None if t0 is None else time.monotonic() - t0
        self.reporter.process(f"bundle@{host}", phase, host=host, detail=detail, elapsed_s=elapsed)

    def check(
        self, host: str, run_dir: str, uses: list[BundleUse], source: str
    ) -> list[dict[str, Any]]:
        args = ["bash", "-c", CHECK_SH, "kvpd-bundle", run_dir, source, NODE_SCRIPT, "check"]
        for u in uses:
            args += [u.slot, u.python]
        r = self.transports(host).run(args, timeout_s=120)
        found = {d.get("slot"): d for d in json_lines(r.stdout)}
        err = r.stderr.strip().splitlines()[-1:] or [f"exit {r.exit_code}"]
        return [
            vet(found[u.slot], u.slot)
            if isinstance(found.get(u.slot), dict)
            else {"slot": u.slot, "ready": False, "problem": err[0][:300]}
            for u in uses
        ]

    def install(self, plan: Plan, run_dirs: dict[str, str]) -> list[SlotResult]:
        """Check, build what is missing, install, verify; raise DeployError when a slot cannot
        be served (listing every such slot with the fix)."""
        self.builders = {h.name for h in plan.hosts if h.bundle_builder}
        return InstallRun(self, plan, run_dirs).run()

    def _done(
        self, host: str, res: list[SlotResult], t0s: dict[str, float], quiet: bool = False
    ) -> None:
        for r in res:
            r.seconds = r.seconds or time.monotonic() - t0s[host]  # kept: when its check ended
        if quiet:
            return
        if all(r.ok for r in res):
            detail = ", ".join(
                f"{r.slot}: {r.action} {str(r.report.get('digest'))[:12]} "
                f"({(r.report.get('native') or {}).get('implementation')}; "
                f"wheel: {origin(r.source)})"
                for r in res
            )
            self._say(host, "healthy", detail, t0s[host])
        else:
            bad = next(r for r in res if not r.ok)
            self._say(host, "failed", f"{bad.slot}: {bad.report.get('problem', '')}", t0s[host])

    def _upgrades(
        self, results: list[SlotResult], todo: list[SlotResult], source: str
    ) -> list[SlotResult]:
        """Verified slots on the NumPy fallback whose platform can now have the native core:
        the controller's own wheel is native, a cached wheel is, or (none cached) a host of
        that platform reports a compiler and the Python headers. A cached fallback wheel means
        a build was tried for this kvpd source and failed: not tried on every `up` again."""
        cands = [r for r in results if fallback(r) and r.report.get("platform")]
        cands = [r for r in cands if r.report.get("pip")]

        def native_at_hand(p: str, host: str) -> bool:  # a build or a cache lookup
            if p == self.local_platform:
                return self.build_local().native
            if (c := self._shared(p, source)) is not None:
                return c.native
            peers = [o for o in (*results, *todo) if o.report.get("platform") == p]
            if any(o.report.get("compiler") and o.host in self.builders for o in peers):
                return True
            if (c := wheels.cached(p, source, built_on=host)) is not None:
                return c.native
            if cross_build.buildable([p]):
                return True
            return any(o.report.get("compiler") for o in peers if o.host == host)

        keys = {(r.report["platform"], r.host) for r in cands}
        able = {k: native_at_hand(*k) for k in sorted(keys)}
        return [r for r in cands if able[(r.report["platform"], r.host)]]

    def _shared(self, platform: str, source: str) -> wheels.Wheel | None:
        """A cached build of a `bundle_builder` host of this platform (serves all its hosts)."""
        for b in sorted(self.builders):
            if (c := wheels.cached(platform, source, built_on=b)) is not None:
                return c
        return None

    def _spread_check(self, r: SlotResult) -> None:
        """A slot holding another host's build is kept only while the profile still lets that
        host build for others; else it is installed again (as if it had failed its check)."""
        built_on = r.source.removeprefix("cache:host:") if r.source.startswith("cache:") else ""
        if built_on and built_on != r.host and built_on not in self.builders:
            why = f"holds the wheel built on {built_on}, which is no longer a bundle_builder"
            r.report = {**r.report, "ready": False, "problem": why}
            r.source = ""

    def _origin_of(self, r: SlotResult, source: str) -> str:
        """Where the wheel of a kept slot came from, by its digest in the controller's cache."""
        p, digest = r.report.get("platform"), r.report.get("digest")
        looks: list[tuple[str, str | None, str]] = [(self.local_platform, None, "local")]
        looks.append((wheels.ANY, None, wheels.ANY))
        if platform_ok(p):
            looks.append((str(p), None, "cross"))  # the controller's cross-build
            hosts = sorted(set(wheels.builders_of(str(p), source)) | {r.host})
            looks += [(str(p), h, f"cache:host:{h}") for h in hosts]
        for platform, host, how in looks:
            w = wheels.cached(platform, source, built_on=host)
            if w is not None and w.digest == digest:
                return how
        return "earlier"

    def _plan_builds(
        self, todo: list[SlotResult], everyone: list[SlotResult], source: str
    ) -> dict[Group, Build]:
        missing: dict[str, list[tuple[str, bool]]] = {}
        for r in todo:
            missing.setdefault(r.report["platform"], []).append(
                (r.host, bool(r.report.get("compiler")))
            )
        builders: dict[str, tuple[str, ...]] = {}
        for r in everyone:  # a builder already holding its bundle can still build for others
            p = r.report.get("platform")
            if p in missing and r.host in self.builders and r.report.get("compiler"):
                builders[p] = tuple(dict.fromkeys((*builders.get(p, ()), r.host)))
        cached: set[Group] = {
            (p, h)
            for p, hosts in missing.items()
            for h in dict.fromkeys([*(h for h, _ in hosts), *self.builders])
            if wheels.cached(p, source, built_on=h) is not None
        }
        cross = cross_build.buildable([p for p in missing if p != self.local_platform])
        return choose_builds(missing, self.local_platform, cached, builders, cross)

    def _obtain(
        self,
        platform: str,
        b: Build,
        slots: list[SlotResult],
        run_dirs: dict[str, str],
        source: str,
    ) -> tuple[wheels.Wheel | None, str]:
        """The wheel for `platform` and where it came from (local | cross | cache:host:NAME |
        host:NAME | any)."""
        if b.how == "local":
            return self.build_local(), "local"
        if b.how == "cross":
            self._say(slots[0].host, "starting", f"cross-building the wheel for {platform}")
            built = self.build_cross(platform)
            if not isinstance(built, str):
                return built, "cross"
            self.warnings.append(f"cross-building the bundle for {platform} failed: {built}")
        if b.how == "cache":
            return wheels.cached(platform, source, built_on=b.hosts[0]), f"cache:host:{b.hosts[0]}"
        for host in b.hosts:
            self._say(host, "starting", f"building the wheel for {platform}")
            t, py = self.transports(host), self.executables[host]
            try:
                w = build_on(t, host, run_dirs[host], py, platform, source)
            except Exception as e:  # noqa: BLE001 - next host, else the NumPy fallback
                self.warnings.append(f"building the bundle on {host} failed: {e}")
                continue
            if w.native:
                return w, f"host:{host}"
        hosts = ", ".join(dict.fromkeys(r.host for r in slots))
        why = (
            f"the build on {', '.join(b.hosts)} failed"
            if b.hosts
            else "no host of that platform that may build for it has a C++ compiler and "
            "Python headers"
        )
        self.warnings.append(
            f"bundle for {platform} ({hosts}): {why}; these hosts run kvpd's NumPy fallback "
            "(same results, slower). Install g++ and the Python headers (python3-dev) on them, "
            "or on one host of that platform and set `bundle_builder: true` on it in the "
            "profile (its build then serves all of them)."
        )
        return self.build_local(native=False), "any"

    def _install_one(
        self, host: str, run_dir: str, res: SlotResult, w: wheels.Wheel, source: str
    ) -> dict[str, Any]:
        t = self.transports(host)
        incoming = posixpath.join(run_dir, BUNDLE_DIR, ".incoming", res.slot, w.name)
        t.put(incoming, wheels.wheel_bytes(w))
        argv = [res.report["executable"], "-I", "-B", "-c", NODE_SCRIPT, "install", run_dir]
        argv += [res.slot, source, incoming, w.digest, w.platform]
        r = t.run(argv, timeout_s=600)
        lines = json_lines(r.stdout)
        if lines:
            rep = vet(lines[-1], res.slot)
            if rep["ready"] and rep.get("digest") != w.digest:  # not the wheel just sent
                rep["ready"] = False
                rep["problem"] = f"reported the bundle {rep.get('digest')} instead of {w.digest}"
            return rep
        err = r.stderr.strip().splitlines()[-1:] or [f"exit {r.exit_code}"]
        return {**res.report, "ready": False, "problem": f"install failed: {err[0][:300]}"}


def install_bundle(
    plan: Plan,
    run_dirs: dict[str, str],
    transports: TransportPool,
    reporter: Reporter | None = None,
    *,
    max_workers: int = 16,
) -> list[BundleSlot]:
    """The executor's step: per-slot results as recorded in the state (none when no process
    of the plan imports kvpd); warnings (e.g. the NumPy fallback on a platform without a
    compiler) go to the reporter."""
    if not plan.bundle:
        return []
    inst = BundleInstaller(transports.__getitem__, reporter, max_workers=max_workers)
    results = inst.install(plan, run_dirs)
    for w in inst.warnings:
        if reporter is not None:
            reporter.message(f"warning: {w}")
    return [r.recorded() for r in results]
