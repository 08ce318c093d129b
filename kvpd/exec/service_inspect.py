"""The deployment service's reading side: the deployment as its hosts record it, status,
logs, diagnose, and the conflicts `up` refuses. Mixed into Deployments (exec/service.py),
which provides the transport pool, the store and the executor."""

from __future__ import annotations

import dataclasses
import posixpath
from collections.abc import Iterator
from dataclasses import dataclass

from kvpd.errors import KvpdError, StateError
from kvpd.exec import logs
from kvpd.exec.diagnose import gather
from kvpd.exec.events import Event, EventLog, note_restarts
from kvpd.exec.executor import Executor
from kvpd.exec.fanout import Fanout
from kvpd.exec.processes import supervised, sweep
from kvpd.exec.processes.status import ProcessStatus
from kvpd.exec.processes.supervised import Supervised
from kvpd.exec.records.conflicts import conflicts
from kvpd.exec.records.current import Current, read_current
from kvpd.exec.report import Reporter
from kvpd.exec.service_hosts import ClientHosts
from kvpd.exec.state import DeploymentState, ProcessRecord, StateStore
from kvpd.plan.processes import ADMIN_TOKEN_FILE
from kvpd.plan.value import Plan


@dataclass(frozen=True)
class LogTail:
    """The end of one process's log, and where it is."""

    deployment: str
    process: str
    host: str
    path: str
    text: str


class Inspecting(ClientHosts):
    """What Deployments does without starting anything."""

    store: StateStore
    seen: Current | None  # what the hosts recorded at the last look
    cached: DeploymentState | None  # the local cache at that look

    def _executor(self, reporter: Reporter | None = None) -> Executor:
        raise NotImplementedError

    def refuse_conflicts(self, plan: Plan) -> None:
        """StateError naming every live kvpd deployment (and its owner, from its host records)
        that holds a port, device or run dir of `plan`, or `plan`'s own deployment running from
        another controller; nothing has started yet."""
        found = conflicts(plan, self.transports(plan))
        if found:
            raise StateError(
                f"up of {plan.deployment!r} refused before anything started: kvpd deployments "
                "on its hosts are in the way (from their host records):\n"
                + "\n".join(f"  - {c}" for c in found)
                + "\nStop that deployment first (`kvpd down` with its profile, from any "
                "controller), or give this one other ports, devices or run dir."
            )

    def current(self, plan: Plan) -> Current:
        """The deployment as `plan`'s hosts record it (exec/records/current.py). A cache this
        folder holds is brought in step (once every host answered), so a `down` from another
        controller shows here as stopped."""
        cache = self.store.load(plan.deployment)
        cur = read_current(plan, self.transports(plan), cache)
        if cache is not None and not cur.unreachable and not cur.refused:
            self.store.save(cur.state)
        self.seen = cur
        self.cached = cache
        return cur

    def _state(self, deployment: str, plan: Plan | None) -> DeploymentState:
        """With `plan` (built from the profile now): the hosts' records, validated against it.
        Without: the local cache as it is (library callers that keep their own store)."""
        if plan is None:
            return self.store.require(deployment)
        if plan.deployment != deployment:
            raise StateError(
                f"the profile plans deployment {plan.deployment!r}, not {deployment!r}"
            )
        return self.current(plan).state

    def events(self, deployment: str) -> EventLog:
        """The append-only event log of `deployment` (next to its state)."""
        return EventLog(self.store.root, deployment)

    def history(self, deployment: str, last: int | None = None) -> list[Event]:
        return self.events(deployment).read(last)

    # -- inspecting --------------------------------------------------------------------

    def diagnose(
        self,
        deployment: str,
        *,
        lines: int = 200,
        shareable: bool = False,
        plan: Plan | None = None,
    ) -> gather.Report:
        """Everything that explains `deployment`'s state, from every host in parallel, into
        `<state root>/<deployment>/diagnose/<time>.tar.gz` (diagnose/gather.py); `shareable`: the
        masked, topology-free form meant for others."""
        state = self._state(deployment, plan)
        ev = self.events(deployment)
        extra = {"events.jsonl": ev.path.read_bytes()} if ev.path.exists() else {}
        out = self.store.root / deployment / "diagnose"
        report = gather.gather(self.transports(state.plan), state, out, lines=lines, extra=extra,
                               shareable=shareable)  # fmt: skip
        bad = [f.name for f in report.processes if f.state not in ("healthy", "running")]
        ev.record("diagnose", str(report.archive), not_ok=bad)
        return report

    def status(
        self, deployment: str, *, plan: Plan | None = None
    ) -> tuple[DeploymentState, list[ProcessStatus]]:
        """The recorded state and each process: alive, healthy, uptime, ports. With `plan`:
        from the hosts' records (drift and refused records in `self.seen`); processes the
        cache had that no host records any more are shown stopped."""
        state = self._state(deployment, plan)
        rows = self._executor().status(state) + self._gone_rows(state)
        if plan is not None:
            self._note_unrecorded(state)
        for row in rows:
            run_dir = state.run_dirs.get(row.host)
            if run_dir and row.alive is not None:
                t = self.transports(state.plan)[row.host]
                row.supervisor = supervised.read(t, run_dir, row.name, row.pid)
            if row.supervisor is not None:
                note_restarts(self.events(deployment), row.name, row.supervisor.restarts,
                              row.supervisor.last_exit)  # fmt: skip
        return state, rows

    def supervisors(self, state: DeploymentState) -> dict[str, Supervised]:
        """The supervisor status of each supervised process of `state`, by name."""
        out: dict[str, Supervised] = {}
        for rec in state.processes:
            run_dir = state.run_dirs.get(rec.host)
            if run_dir:
                t = self.transports(state.plan)[rec.host]
                sup = supervised.read(t, run_dir, rec.name, rec.pid)
                if sup is not None:
                    out[rec.name] = sup
        return out

    def running(self, deployment: str) -> DeploymentState | None:
        """The state of `deployment` if any of its processes is (or may be) alive."""
        state = self.store.load(deployment)
        if state is None:
            return None
        rows = self._executor().status(state)
        return state if any(r.alive is not False for r in rows) else None

    def _plan_run_dirs(self, state: DeploymentState, skip: set[str]) -> None:
        """Add the plan's run dir (as its transport resolves it) of each process host that has
        none in `state` and is not in `skip`; a host that cannot resolve it is left out."""
        pool = self.transports(state.plan)
        for h in sorted({p.host for p in state.plan.processes} - set(state.run_dirs) - skip):
            try:
                state.run_dirs[h] = pool[h].resolve(state.plan.host(h).run_dir)
            except Exception:  # noqa: BLE001 - unreachable: its records were not read either
                continue

    def _note_unrecorded(self, state: DeploymentState) -> None:
        """Into `self.seen`: the deployment's sessions that run on its hosts with its marks
        (exec/processes/sweep.py) but that no record names, as an `up` killed between a start
        and its record leaves them; `down` stops them. Hosts whose record was refused or that
        did not answer are not asked."""
        cur = self.seen
        if cur is None:
            return
        probe = dataclasses.replace(state, run_dirs=dict(state.run_dirs))
        self._plan_run_dirs(probe, skip=set(cur.refused) | set(cur.unreachable))
        for h in set(cur.refused) | set(cur.unreachable):
            probe.run_dirs.pop(h, None)
        with Fanout(8) as fan:
            cur.unrecorded, cur.unasked = sweep.find_unrecorded(
                self.transports(state.plan), fan.map, probe
            )

    def _gone_rows(self, state: DeploymentState) -> list[ProcessStatus]:
        """Rows for what the cache had that the hosts no longer record (stopped elsewhere)."""
        if self.seen is None or self.cached is None or self.seen.unreachable:
            return []
        now = {r.name for r in state.processes}
        return [ProcessStatus(r.name, r.host, r.pid, False, None, None, r.ports, [], r.log,
                              "stopped (no host records it any more)")
                for r in self.cached.processes if r.name not in now]  # fmt: skip

    def _host_token(self, state: DeploymentState) -> str:
        """The proxy's admin token from its host (a controller without the local copy)."""
        run_dir = state.run_dirs.get(state.plan.proxy_host)
        if not run_dir:
            return ""
        try:
            t = self.transports(state.plan)[state.plan.proxy_host]
            raw = t.read(posixpath.join(run_dir, ADMIN_TOKEN_FILE))
        except (OSError, KvpdError):
            return ""
        return raw.decode("utf-8", "replace").strip()[:200]

    def _process(
        self, name: str, deployment: str | None, plan: Plan | None = None
    ) -> tuple[DeploymentState, ProcessRecord]:
        dep = deployment or (plan.deployment if plan else self.deployment_with_process(name))
        state = self._state(dep, plan) if plan is not None else self.store.load(dep)
        if state is None:
            raise StateError(f"no state for deployment {dep!r} under {self.store.root}.")
        rec = state.record(name)
        if rec is None:
            known = ", ".join(r.name for r in state.processes) or "none started"
            raise StateError(f"deployment {dep!r} has no process {name!r} (known: {known}).")
        return state, rec

    def deployment_with_process(self, name: str) -> str:
        having = [
            d for d in self.store.deployments()
            if (s := self.store.load(d)) is not None and s.record(name)
        ]  # fmt: skip
        if len(having) == 1:
            return having[0]
        if not having:
            raise StateError(f"no deployment under {self.store.root} has a process {name!r}.")
        raise StateError(f"{name!r} exists in {', '.join(having)}: pick one with --deployment.")

    def logs(
        self, name: str, *, deployment: str | None = None, lines: int = 50, plan: Plan | None = None
    ) -> LogTail:
        """The last `lines` lines of process `name`'s log (deployment found by the name when
        only one has such a process; with `plan`, from the hosts' records)."""
        state, rec = self._process(name, deployment, plan)
        text = logs.tail(self.transports(state.plan)[rec.host], rec.log, lines)
        return LogTail(state.deployment, rec.name, rec.host, rec.log, text)

    def follow(self, log: LogTail) -> Iterator[str]:
        """What is appended to `log` from now on, until the caller stops iterating."""
        return logs.follow(self._pool[log.host], log.path)
