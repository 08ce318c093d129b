"""The bundle step of `kvpd up`: put kvpd on every host slot of `Plan.bundle`, verified.

One round trip per host checks every slot (`bundle_node.py check` in the slot's Python): a slot
that already holds this kvpd for its platform is verified and kept, so a second `up` costs one
check per host. For the others, one wheel per platform: the controller's own build where the
platform is the controller's, else a cached one, else one the controller cross-builds (aarch64
hosts, when it has the cross toolchain: kvpd.exec.cross_build), else built once on the first
host of that platform that has a compiler, else the wheel without the native core (NumPy
fallback; an error when a process requires the native core). Each is then installed with the
slot's own pip into `<run dir>/bundle/<digest>/` and verified the same way. Hosts run in parallel.

Nothing here writes outside `<run dir>/bundle` on a host, and nothing touches the user's Python
environments: pip runs with `--target`.
"""

from __future__ import annotations

import json
import posixpath
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvpd.exec import cross_build
from kvpd.exec import wheel as wheels
from kvpd.exec.bundle_result import SlotResult, judge
from kvpd.exec.fanout import Fanout
from kvpd.exec.pool import TransportPool
from kvpd.exec.stop import NullReporter, Reporter
from kvpd.exec.transport import Transport
from kvpd.plan.bundle import BUNDLE_DIR, BundleUse
from kvpd.plan.value import Plan

NODE_SCRIPT = (wheels.BUILDER.parent / "bundle_node.py").read_text()
# Resolves each slot's interpreter (a command, or "@CMD": the #! interpreter of console script
# CMD, including pip's `#!/bin/sh` + `'''exec' "python"` form for long paths) and runs the node
# script in it. Arguments: RUN_DIR SOURCE SCRIPT MODE (check | facts), then SLOT SPEC pairs.
# One JSON line per slot.
CHECK_SH = r"""
set -f
interp() {
  case $1 in
    @*) f=$(command -v -- "${1#@}") || return 1
        IFS= read -r l < "$f" || return 1
        case $l in
          '#!/bin/sh'*) l=$(sed -n 2p -- "$f"); l=${l#*\"}; printf '%s\n' "${l%%\"*}" ;;
          '#!'*) set -- ${l#??}
                 if [ "${1##*/}" = env ]; then shift; [ "$1" = -S ] && shift; command -v -- "$1"
                 else printf '%s\n' "$1"; fi ;;
          *) printf '%s/python\n' "$(dirname -- "$f")" ;;
        esac ;;
    *) command -v -- "$1" ;;
  esac
}
run_dir=$1 source=$2 script=$3 mode=${4:-check}
shift 4
while [ $# -ge 2 ]; do
  slot=$1 spec=$2
  shift 2
  if ! py=$(interp "$spec") || [ -z "$py" ]; then
    printf '{"slot": "%s", "ready": false, "problem": "interpreter not found"}\n' "$slot"
    continue
  fi
  "$py" -I -S -c "$script" "$mode" "$run_dir" "$slot" "$source" ||
    printf '{"slot": "%s", "ready": false, "problem": "%s exited %s"}\n' "$slot" "$py" "$?"
done
"""
BUILD_SH = r"""
cd -- "$1" && rm -rf src out && mkdir src && tar -xzf src.tar.gz -C src &&
  "$2" -I src/wheel_build.py src out
"""


@dataclass(frozen=True)
class Build:
    """How the wheel of one platform is obtained: "local", "cache", "cross" (cross-built on
    the controller), "hosts" (try `hosts` in order), or "any" (no compiler anywhere: the wheel
    without the native core)."""

    how: str
    hosts: tuple[str, ...] = ()


def choose_builds(
    missing: dict[str, list[tuple[str, bool]]],
    local_platform: str,
    cached: set[str],
    cross: frozenset[str] = frozenset(),
) -> dict[str, Build]:
    """Per platform that some slot lacks (-> [(host, host has a compiler)] in plan order);
    `cross`: the platforms the controller can cross-build for."""
    out: dict[str, Build] = {}
    for platform, hosts in missing.items():
        if platform == local_platform:
            out[platform] = Build("local")
        elif platform in cached:
            out[platform] = Build("cache")
        elif platform in cross:
            out[platform] = Build("cross")
        else:
            able = tuple(dict.fromkeys(h for h, cxx in hosts if cxx))
            out[platform] = Build("hosts", able) if able else Build("any")
    return out


def fallback(r: SlotResult) -> bool:
    """A verified slot holding the wheel without the native core (the one hosts get when no
    build for their platform was possible): what a native build can replace."""
    return r.ok and r.report.get("bundle_platform") == wheels.ANY


def json_lines(stdout: str) -> list[dict[str, Any]]:
    out = []
    for line in stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


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

    def _say(self, host: str, phase: str, detail: str = "", t0: float | None = None) -> None:
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
            found.get(u.slot) or {"slot": u.slot, "ready": False, "problem": err[0][:300]}
            for u in uses
        ]

    def install(self, plan: Plan, run_dirs: dict[str, str]) -> list[SlotResult]:
        """Check, build what is missing, install, verify; raise DeployError when a slot cannot
        be served (listing every such slot with the fix)."""
        source = wheels.source_digest()
        by_host: dict[str, list[BundleUse]] = {}
        for u in plan.bundle:
            by_host.setdefault(u.host, []).append(u)
        results = {(u.host, u.slot): SlotResult(u.host, u.slot, u.python) for u in plan.bundle}
        uses = {(u.host, u.slot): u for u in plan.bundle}
        t0s = {h: time.monotonic() for h in by_host}
        workers = max(1, min(self.max_workers, len(by_host)))
        with Fanout(workers) as pool:

            def slots(host: str) -> list[SlotResult]:
                return [results[(host, u.slot)] for u in by_host[host]]

            def ready(host: str) -> bool:
                """Every slot verified, none a fallback an upgrade may replace: done."""
                return all(r.ok and not fallback(r) for r in slots(host))

            def first(host: str) -> None:
                self._say(host, "starting", "checking the bundle")
                for rep in self.check(host, run_dirs[host], by_host[host], source):
                    results[(host, rep["slot"])].report = rep
                if ready(host):
                    self._done(host, slots(host), t0s)

            list(pool.map(first, by_host))
            todo = [r for r in results.values() if not r.ok and not r.report.get("too_old")]
            todo = [r for r in todo if r.report.get("platform") and r.report.get("pip")]
            # kept on the NumPy fallback: the old report stays unless a native install succeeds
            kept = {
                (r.host, r.slot): r.report
                for r in self._upgrades(list(results.values()), todo, source)
            }
            todo += [results[k] for k in kept]
            builds = self._plan_builds(todo, source)
            pending = {h: sum(r.host == h for r in todo) for h in {r.host for r in todo}}
            host_locks = {h: threading.Lock() for h in pending}
            count_lock = threading.Lock()
            for h in by_host:  # held back by `first` for an upgrade that is not possible
                if h not in pending and not ready(h) and all(r.ok for r in slots(h)):
                    self._done(h, slots(h), t0s)

            def settle(res: SlotResult) -> None:
                with count_lock:
                    pending[res.host] -= 1
                    last = pending[res.host] == 0
                if last:
                    self._done(res.host, slots(res.host), t0s)

            def install_slot(res: SlotResult, w: wheels.Wheel) -> None:
                with host_locks[res.host]:  # one pip at a time per host (slots may share a digest)
                    self._say(res.host, "starting", f"installing {w.name} for {res.slot}")
                    res.report = self._install_one(res.host, run_dirs[res.host], res, w, source)
                res.action = "installed" if res.ok else "failed"
                if (res.host, res.slot) in kept and not res.ok:  # the fallback still serves
                    self.warnings.append(
                        f"upgrading the bundle of {res.host} ({res.slot}) to the native core "
                        f"failed: {res.report.get('problem')}; it keeps the NumPy fallback"
                    )
                    res.report, res.action, res.source = kept[(res.host, res.slot)], "kept", ""
                res.seconds = time.monotonic() - t0s[res.host]
                settle(res)

            def platform(name: str) -> None:
                """Obtain this platform's wheel, then install it at once on its hosts: hosts of
                the controller's platform do not wait for another platform's build."""
                mine = [r for r in todo if r.report["platform"] == name]
                w, how = self._obtain(name, builds[name], mine, run_dirs, source)
                if w is not None and not w.native:  # an upgrade needs the native core
                    for r in [r for r in mine if (r.host, r.slot) in kept]:
                        mine.remove(r)
                        settle(r)
                for r in mine:
                    r.source = how
                if w is not None:
                    list(pool.map(lambda r: install_slot(r, w), mine))

            with Fanout(max(1, len(builds))) as platforms:
                list(platforms.map(platform, sorted(builds)))
            for h, left in pending.items():
                if left:  # no wheel for some slot of it: show the failure
                    self._done(h, slots(h), t0s)
        for r in results.values():
            if r.action == "kept" and not r.ok:
                r.action = "failed"
            self._done(r.host, [r], t0s, quiet=True)
        judge(list(results.values()), uses)
        return list(results.values())

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
                f"({(r.report.get('native') or {}).get('implementation')})"
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

        def native_at_hand(p: str) -> bool:  # once per platform: a build or a cache lookup
            if p == self.local_platform:
                return self.build_local().native
            if (c := wheels.cached(p, source)) is not None:
                return c.native
            if p != self.local_platform and cross_build.buildable([p]):
                return True
            return any(o.report.get("compiler") for o in (*results, *todo)
                       if o.report.get("platform") == p)  # fmt: skip

        able = {p: native_at_hand(p) for p in {r.report["platform"] for r in cands}}
        return [r for r in cands if able[r.report["platform"]]]

    def _plan_builds(self, todo: list[SlotResult], source: str) -> dict[str, Build]:
        missing: dict[str, list[tuple[str, bool]]] = {}
        for r in todo:
            missing.setdefault(r.report["platform"], []).append(
                (r.host, bool(r.report.get("compiler")))
            )
        cached = {p for p in missing if wheels.cached(p, source) is not None}
        mine = self.local_platform
        cross = cross_build.buildable([p for p in missing if p not in cached and p != mine])
        return choose_builds(missing, self.local_platform, cached, cross)

    def _obtain(
        self,
        platform: str,
        b: Build,
        slots: list[SlotResult],
        run_dirs: dict[str, str],
        source: str,
    ) -> tuple[wheels.Wheel | None, str]:
        """The wheel for `platform` and where it came from (local|cache|cross|host:NAME|any)."""
        if b.how == "local":
            return self.build_local(), "local"
        if b.how == "cache":
            return wheels.cached(platform, source), "cache"
        if b.how == "cross":
            self._say(slots[0].host, "starting", f"cross-building the wheel for {platform}")
            built = self.build_cross(platform)
            if not isinstance(built, str):
                return built, "cross"
            self.warnings.append(f"cross-building the bundle for {platform} failed: {built}")
        for host in b.hosts:
            py = next(r.report["executable"] for r in slots if r.host == host)
            try:
                w = self._build_on(host, run_dirs[host], py, platform, source)
            except Exception as e:  # noqa: BLE001 - next host, else the NumPy fallback
                self.warnings.append(f"building the bundle on {host} failed: {e}")
                w = None
            if w is not None and w.native:
                return w, f"host:{host}"
        hosts = ", ".join(dict.fromkeys(r.host for r in slots))
        why = (
            f"the build on {', '.join(b.hosts)} failed"
            if b.hosts
            else "no host of that platform has a C++ compiler and Python headers"
        )
        self.warnings.append(
            f"bundle for {platform} ({hosts}): {why}; these hosts run kvpd's NumPy fallback "
            "(same results, slower). Install g++ and the Python headers (python3-dev) on one "
            "of them for the native core."
        )
        return self.build_local(native=False), "any"

    def _build_on(
        self, host: str, run_dir: str, python: str, platform: str, source: str
    ) -> wheels.Wheel | None:
        t = self.transports(host)
        d = posixpath.join(run_dir, BUNDLE_DIR, f".build-{source[:16]}")
        self._say(host, "starting", f"building the wheel for {platform}")
        t.put(posixpath.join(d, "src.tar.gz"), wheels.source_tarball())
        r = t.run(["bash", "-c", BUILD_SH, "kvpd-build", d, python], timeout_s=900)
        res = json_lines(r.stdout)
        try:
            if not r.ok or not res:
                self.warnings.append(f"building the bundle on {host} failed: {r.stderr[-300:]}")
                return None
            data = t.read(res[-1]["wheel"])
            name = posixpath.basename(res[-1]["wheel"])
            return wheels.store(platform, name, data, res[-1]["native"], res[-1]["why"])
        finally:
            t.run(["rm", "-rf", "--", d], timeout_s=60)

    def _install_one(
        self, host: str, run_dir: str, res: SlotResult, w: wheels.Wheel, source: str
    ) -> dict[str, Any]:
        t = self.transports(host)
        incoming = posixpath.join(run_dir, BUNDLE_DIR, ".incoming", res.slot, w.name)
        t.put(incoming, w.path.read_bytes())
        argv = [res.report["executable"], "-I", "-c", NODE_SCRIPT, "install", run_dir]
        argv += [res.slot, source, incoming, w.digest, w.platform]
        r = t.run(argv, timeout_s=600)
        lines = json_lines(r.stdout)
        if lines:
            return lines[-1]
        err = r.stderr.strip().splitlines()[-1:] or [f"exit {r.exit_code}"]
        return {**res.report, "ready": False, "problem": f"install failed: {err[0][:300]}"}


def install_bundle(
    plan: Plan,
    run_dirs: dict[str, str],
    transports: TransportPool,
    reporter: Reporter | None = None,
    *,
    max_workers: int = 16,
) -> list[dict[str, Any]]:
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
    return [r.to_dict() for r in results]
