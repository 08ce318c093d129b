"""One `BundleInstaller.install`: the state its parallel steps share (the slots' results, the
hosts' pending installs) and the steps themselves, in order: check every host, choose the
builds, obtain one wheel per platform and install it on that platform's hosts."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from kvpd.exec.bundle import wheel as wheels
from kvpd.exec.bundle.builds import Build, Group, group_of
from kvpd.exec.bundle.result import SlotResult, judge
from kvpd.exec.fanout import Fanout
from kvpd.plan.bundle import BundleSlotName, BundleUse
from kvpd.plan.value import Plan

if TYPE_CHECKING:
    from kvpd.exec.bundle.installer import BundleInstaller


def fallback(r: SlotResult) -> bool:
    """A verified slot holding the wheel without the native core (the one hosts get when no
    build for their platform was possible): what a native build can replace."""
    return r.ok and r.report.get("bundle_platform") == wheels.ANY


class InstallRun:
    def __init__(self, inst: BundleInstaller, plan: Plan, run_dirs: dict[str, str]) -> None:
        self.inst = inst
        self.run_dirs = run_dirs
        self.source = wheels.source_digest()
        self.by_host: dict[str, list[BundleUse]] = {}
        for u in plan.bundle:
            self.by_host.setdefault(u.host, []).append(u)
        self.results = {(u.host, u.slot): SlotResult(u.host, u.slot, u.python) for u in plan.bundle}
        self.uses = {(u.host, u.slot): u for u in plan.bundle}
        self.t0s = {h: time.monotonic() for h in self.by_host}
        self.todo: list[SlotResult] = []
        self.kept: dict[tuple[str, BundleSlotName], dict[str, Any]] = {}
        self.builds: dict[Group, Build] = {}
        self.pending: dict[str, int] = {}
        self.host_locks: dict[str, threading.Lock] = {}
        self.count_lock = threading.Lock()

    def slots(self, host: str) -> list[SlotResult]:
        return [self.results[(host, u.slot)] for u in self.by_host[host]]

    def ready(self, host: str) -> bool:
        """Every slot verified, none a fallback an upgrade may replace: done."""
        return all(r.ok and not fallback(r) for r in self.slots(host))

    def done(self, host: str) -> None:
        self.inst._done(host, self.slots(host), self.t0s)

    def run(self) -> list[SlotResult]:
        workers = max(1, min(self.inst.max_workers, len(self.by_host)))
        with Fanout(workers) as pool:
            list(pool.map(self.first, self.by_host))
            self.choose()
            with Fanout(max(1, len(self.builds))) as platforms:
                groups = sorted(self.builds, key=lambda g: (g[0], g[1] or ""))
                list(platforms.map(lambda key: self.platform(key, pool), groups))
            for h, left in self.pending.items():
                if left:  # no wheel for some slot of it: show the failure
                    self.done(h)
        for r in self.results.values():
            if r.action == "kept" and not r.ok:
                r.action = "failed"
            self.inst._done(r.host, [r], self.t0s, quiet=True)
        judge(list(self.results.values()), self.uses)
        return list(self.results.values())

    def first(self, host: str) -> None:
        """Check every slot of `host`; a host with nothing to do is done at once."""
        inst = self.inst
        inst._say(host, "starting", "checking the bundle")
        for rep in inst.check(host, self.run_dirs[host], self.by_host[host], self.source):
            r = self.results[(host, rep["slot"])]
            r.report = rep
            if r.ok:  # kept unless replaced below: its wheel's origin, by digest
                r.source = inst._origin_of(r, self.source)
                inst._spread_check(r)
        if self.ready(host):
            self.done(host)

    def choose(self) -> None:
        """What to install where (failed checks, upgrades of fallbacks) and the builds."""
        inst, everyone = self.inst, list(self.results.values())
        inst.executables = {
            r.host: r.report["executable"] for r in everyone if r.report.get("executable")
        }
        todo = [r for r in everyone if not r.ok and not r.report.get("too_old")]
        todo = [r for r in todo if r.report.get("platform") and r.report.get("pip")]
        # kept on the NumPy fallback: the old report stays unless a native install succeeds
        self.kept = {
            (r.host, r.slot): r.report for r in inst._upgrades(everyone, todo, self.source)
        }
        todo += [self.results[k] for k in self.kept]
        self.todo = todo
        self.builds = inst._plan_builds(todo, everyone, self.source)
        self.pending = {h: sum(r.host == h for r in todo) for h in {r.host for r in todo}}
        self.host_locks = {h: threading.Lock() for h in self.pending}
        for h in self.by_host:  # held back by `first` for an upgrade that is not possible
            if h not in self.pending and not self.ready(h) and all(r.ok for r in self.slots(h)):
                self.done(h)

    def settle(self, res: SlotResult) -> None:
        with self.count_lock:
            self.pending[res.host] -= 1
            last = self.pending[res.host] == 0
        if last:
            self.done(res.host)

    def install_slot(self, res: SlotResult, w: wheels.Wheel) -> None:
        inst, source = self.inst, self.source
        with self.host_locks[res.host]:  # one pip at a time per host (slots may share a digest)
            inst._say(res.host, "starting", f"installing {w.name} for {res.slot}")
            res.report = inst._install_one(res.host, self.run_dirs[res.host], res, w, source)
        res.action = "installed" if res.ok else "failed"
        if (res.host, res.slot) in self.kept and not res.ok:  # the fallback still serves
            inst.warnings.append(
                f"upgrading the bundle of {res.host} ({res.slot}) to the native core "
                f"failed: {res.report.get('problem')}; it keeps the NumPy fallback"
            )
            res.report, res.action = self.kept[(res.host, res.slot)], "kept"
            res.source = inst._origin_of(res, source)
        res.seconds = time.monotonic() - self.t0s[res.host]
        self.settle(res)

    def platform(self, key: Group, pool: Fanout) -> None:
        """Obtain this group's wheel, then install it at once on its hosts: hosts of the
        controller's platform do not wait for another platform's build."""
        mine = [r for r in self.todo if group_of(r, self.builds) == key]
        w, how = self.inst._obtain(key[0], self.builds[key], mine, self.run_dirs, self.source)
        if w is not None and not w.native:  # an upgrade needs the native core
            for r in [r for r in mine if (r.host, r.slot) in self.kept]:
                mine.remove(r)
                self.settle(r)
        for r in mine:
            r.source = how
        if w is not None:
            list(pool.map(lambda r: self.install_slot(r, w), mine))
