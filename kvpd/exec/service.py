"""The deployment service: the one way the CLI and bench act on deployments.

`with Deployments(...) as svc:` holds one transport pool for everything done inside (each host
is connected once, and closed once at the end); every operation returns a value the caller
renders. Nothing here prints.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import TracebackType

from kvpd.errors import DeployError, StateError
from kvpd.exec import admin_token, client_key, gather, logs, rolling, supervised
from kvpd.exec.checks import Check
from kvpd.exec.container_life import remove_containers, start_containers
from kvpd.exec.events import Event, EventLog, note_restarts
from kvpd.exec.executor import DEFAULT_GRACE_S, DownResult, Executor
from kvpd.exec.interrupts import sigterm_as_interrupt
from kvpd.exec.lease_scope import Leasing, leased
from kvpd.exec.pool import TransportPool
from kvpd.exec.preflight import run_checks
from kvpd.exec.proxy_admin import ProxyAdmin
from kvpd.exec.purge import purge_run_dirs
from kvpd.exec.rolling import CanaryCheck, CanaryOutcome, Roller, Step
from kvpd.exec.state import DeploymentState, ProcessRecord, StateStore
from kvpd.exec.status import ProcessStatus
from kvpd.exec.stop import NullReporter, Reporter
from kvpd.exec.supervised import Supervised
from kvpd.exec.transport import CommandResult, Transport
from kvpd.plan.value import Plan


class PreflightFailed(DeployError):
    """Preflight found problems; nothing was started. `checks` holds every check."""

    def __init__(self, plan: Plan, checks: list[Check]) -> None:
        failed = [c for c in checks if not c.ok]
        lines = [f"  - {c.host}: {c.name}: {c.detail}" + (f" ({c.fix})" if c.fix else "")
                 for c in failed]  # fmt: skip
        super().__init__(
            f"preflight of {plan.deployment!r} failed ({len(failed)} of {len(checks)} checks): "
            "nothing was started. Fix the hosts or the profile, or skip the checks "
            "(--skip-preflight).\n" + "\n".join(lines)
        )
        self.checks = checks


@dataclass(frozen=True)
class LogTail:
    """The end of one process's log, and where it is."""

    deployment: str
    process: str
    host: str
    path: str
    text: str


@leased(up="up", down="down", restart="restart", roll="restart")
class Deployments(Leasing):
    """check, up, down, restart, status and logs of deployments, over one transport pool.

    `transports`: transports to use instead of opening them (tests, the local demo); hosts not
    in it are opened on first use and closed when the service is.
    """

    def __init__(
        self,
        store: StateStore | None = None,
        *,
        accept_new_host_keys: bool = False,
        grace_s: float = DEFAULT_GRACE_S,
        serial: bool = False,
        transports: Mapping[str, Transport] | None = None,
    ) -> None:
        self.store = store or StateStore()
        self.grace_s = grace_s
        self.serial = serial
        self._pool = TransportPool(
            [], dict(transports or {}), accept_unknown_host_key=accept_new_host_keys
        )

    def __enter__(self) -> Deployments:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the connections the service opened (detached processes keep running)."""
        self._pool.close()

    def _executor(self, reporter: Reporter | None = None) -> Executor:
        return Executor(
            self._pool, reporter, store=self.store, grace_s=self.grace_s, serial=self.serial
        )

    def transports(self, plan: Plan) -> TransportPool:
        """The one way to `plan`'s hosts, their files and ports (opened on first use)."""
        self._pool.add_hosts(plan.hosts)
        return self._pool

    # -- before up ---------------------------------------------------------------------

    def check(self, plan: Plan) -> list[Check]:
        """The read-only preflight checks on every host of `plan` (see exec/preflight.py)."""
        self._pool.add_hosts(plan.hosts)
        return run_checks(plan, self._pool.__getitem__)

    def prepare(self, plan: Plan, *, profile: str, preflight: bool = True) -> list[Check]:
        """What `up` verifies before it starts anything: the deployment is not running
        (StateError) and, with `preflight`, the checks, returned (failed ones included) so the
        caller can show them before asking to go on."""
        self._executor().refuse_if_running(plan.deployment, profile or plan.deployment)
        if not preflight:
            return []
        if not any(h.container and h.container.started_by_kvpd for h in plan.hosts):
            return self.check(plan)
        # Containers kvpd starts must run before preflight can look inside; when
        # a check fails they are removed again (`up` starts them anew if the user goes on).
        self._pool.add_hosts(plan.hosts)
        start_containers(plan, self._pool, NullReporter())
        checks = self.check(plan)
        if not all(c.ok for c in checks):
            remove_containers(plan, self._pool, NullReporter())
        return checks

    # -- up / down ---------------------------------------------------------------------

    def up(
        self,
        plan: Plan,
        *,
        profile: str = "",
        reporter: Reporter | None = None,
        preflight: bool = True,
        prepared: bool = False,
    ) -> DeploymentState:
        """Start `plan` stage by stage (see Executor.up); on failure everything started is
        stopped and DeployError raised. Unless the caller already called `prepare` for this
        plan (`prepared`), it runs here: a running deployment is refused and failed checks
        raise PreflightFailed."""
        if not prepared:
            checks = self.prepare(plan, profile=profile, preflight=preflight)
            if not all(c.ok for c in checks):
                raise PreflightFailed(plan, checks)
        events = self.events(plan.deployment)
        plan = client_key.attach(admin_token.issue(plan, self.store.root))
        try:
            with sigterm_as_interrupt():
                state = self._executor(reporter).up(plan, profile=profile, refuse_running=False)
        except BaseException as e:
            events.record("up-failed", str(e).splitlines()[0] if str(e) else type(e).__name__)
            raise
        events.record("up", f"{len(state.processes)} processes", profile=profile)
        return state

    def canary(
        self, plan: Plan, run: CanaryCheck, *, keep_on_failure: bool = True
    ) -> CanaryOutcome:
        """`run(plan, transports)` (the bench's canary: one real request through the proxy,
        proven from /metrics; passed in, as exec does not import bench), recorded in the event
        log. A failure stops the deployment unless `keep_on_failure`."""
        result = run(plan, self.transports(plan))
        self.events(plan.deployment).record(
            "canary", result.line, ok=result.ok, problems=result.problems
        )
        if not result.ok and not keep_on_failure:
            self.down(plan.deployment)
        return result

    def events(self, deployment: str) -> EventLog:
        """The append-only event log of `deployment` (next to its state)."""
        return EventLog(self.store.root, deployment)

    def history(self, deployment: str, last: int | None = None) -> list[Event]:
        return self.events(deployment).read(last)

    def down(self, deployment: str, reporter: Reporter | None = None) -> DownResult | None:
        """Stop every recorded process of `deployment`; None when it has no state."""
        state = self.store.load(deployment)
        if state is None:
            return None
        self._pool.add_hosts(state.plan.hosts)
        children = self.supervisors(state)  # read before the supervisors go
        result = self._executor(reporter).down(state)
        self._reap_children(state, children, result)
        self.events(deployment).record(
            "down", "clean" if result.clean else "incomplete: " + "; ".join(problems(result))
        )
        return result

    def _reap_children(
        self, state: DeploymentState, children: dict[str, Supervised], result: DownResult
    ) -> None:
        """A supervisor forwards the stop to its child; verify the child went with it (and
        kill its group if not: a supervisor killed past its grace leaves it to the kernel's
        PDEATHSIG, which does not reach the engine's own children)."""
        for name, sup in children.items():
            rec = state.record(name)
            if rec is not None and sup.child_pid:
                outcome = supervised.reap_child(self._pool[rec.host], name, rec.host, sup)
                if outcome is not None:
                    result.stop.outcomes.append(outcome)

    def purge(self, state: DeploymentState) -> dict[str, str]:
        """Remove every host's run dir of a stopped deployment (rendered files, logs, the node
        bundle): host -> why a run dir was kept, for those not removed."""
        self._pool.add_hosts(state.plan.hosts)
        return purge_run_dirs(state, self._pool.__getitem__)

    def stop(self, deployment: str, reporter: Reporter | None = None) -> None:
        """`down`, raising StateError unless everything is gone and its ports are free."""
        result = self.down(deployment, reporter)
        if result is not None and not result.clean:
            raise StateError(f"down of {deployment!r} incomplete: " + "; ".join(problems(result)))

    def restart(
        self, plan: Plan, *, profile: str = "", reporter: Reporter | None = None
    ) -> DeploymentState:
        """Stop the deployment (completely) and start `plan` for it, with preflight."""
        self.stop(plan.deployment, reporter)
        return self.up(plan, profile=profile, reporter=reporter)

    def roll(
        self,
        deployment: str,
        targets: list[str],
        *,
        reporter: Reporter | None = None,
        canary: CanaryCheck | None = None,
        drain_timeout_s: float = 60.0,
        on_step: Callable[[Step], None] | None = None,
    ) -> list[Step]:
        """Rolling restart of `targets` (names or groups; all when empty) of a running
        deployment: for each in turn drain, stop, start, health gate, re-admit, canary (see
        exec/rolling.py), `canary(plan)` after each. Stops at the first failure (DeployError),
        the rest untouched."""
        state = self.store.require(deployment)
        plan = state.plan
        self._pool.add_hosts(plan.hosts)
        specs = rolling.select(plan, targets)
        admin = None
        if plan.proxy_url and any(p.role == "proxy" for p in plan.processes):
            token = admin_token.read(self.store.root, deployment)
            admin = ProxyAdmin(self._pool[plan.proxy_host], plan.proxy_url, token)
        check = None
        if canary is not None:

            def check() -> tuple[bool, str]:
                r = self.canary(plan, canary)
                return r.ok, r.line

        ex = self._executor(reporter)
        ex.transports.add_hosts(plan.hosts)
        roller = Roller(ex, state, admin, check, drain_timeout_s=drain_timeout_s,
                        save=lambda: self.store.save(state))  # fmt: skip
        steps: list[Step] = []
        for spec in specs:
            try:
                step = roller.restart(spec)
            except BaseException as e:
                self.events(deployment).record("restart-failed", f"{spec.name}: {e}")
                raise
            self.events(deployment).record(
                "restart", f"{spec.name} in {step.seconds:.1f}s", drained=step.drained
            )
            steps.append(step)
            if on_step is not None:
                on_step(step)
        return steps

    # -- inspecting --------------------------------------------------------------------

    def diagnose(
        self, deployment: str, *, lines: int = 200, shareable: bool = False
    ) -> gather.Report:
        """Everything that explains `deployment`'s state, from every host in parallel, into
        `<state root>/<deployment>/diagnose/<time>.tar.gz` (exec/gather.py); `shareable`: the
        masked, topology-free form meant for others."""
        state = self.store.require(deployment)
        ev = self.events(deployment)
        extra = {"events.jsonl": ev.path.read_bytes()} if ev.path.exists() else {}
        out = self.store.root / deployment / "diagnose"
        report = gather.gather(self._pool, state, out, lines=lines, extra=extra,
                               shareable=shareable)  # fmt: skip
        bad = [f.name for f in report.processes if f.state not in ("healthy", "running")]
        ev.record("diagnose", str(report.archive), not_ok=bad)
        return report

    def status(self, deployment: str) -> tuple[DeploymentState, list[ProcessStatus]]:
        """The recorded state and each process: alive, healthy, uptime, ports."""
        state = self.store.require(deployment)
        rows = self._executor().status(state)
        for row in rows:
            run_dir = state.run_dirs.get(row.host)
            if run_dir and row.alive is not None:
                row.supervisor = supervised.read(self._pool[row.host], run_dir, row.name, row.pid)
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
                sup = supervised.read(self._pool[rec.host], run_dir, rec.name, rec.pid)
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

    def _process(self, name: str, deployment: str | None) -> tuple[DeploymentState, ProcessRecord]:
        dep = deployment or self._deployment_with_process(name)
        state = self.store.load(dep)
        if state is None:
            raise StateError(f"no state for deployment {dep!r} under {self.store.root}.")
        rec = state.record(name)
        if rec is None:
            known = ", ".join(r.name for r in state.processes) or "none started"
            raise StateError(f"deployment {dep!r} has no process {name!r} (known: {known}).")
        self._pool.add_hosts(state.plan.hosts)
        return state, rec

    def _deployment_with_process(self, name: str) -> str:
        having = [
            d for d in self.store.deployments()
            if (s := self.store.load(d)) is not None and s.record(name)
        ]  # fmt: skip
        if len(having) == 1:
            return having[0]
        if not having:
            raise StateError(f"no deployment under {self.store.root} has a process {name!r}.")
        raise StateError(f"{name!r} exists in {', '.join(having)}: pick one with --deployment.")

    def logs(self, name: str, *, deployment: str | None = None, lines: int = 50) -> LogTail:
        """The last `lines` lines of process `name`'s log (deployment found by the name when
        only one has such a process)."""
        state, rec = self._process(name, deployment)
        text = logs.tail(self._pool[rec.host], rec.log, lines)
        return LogTail(state.deployment, rec.name, rec.host, rec.log, text)

    # -- a client on a cluster host (kvpd bench with bench.host) -------------------------------

    def host_dir(self, plan: Plan, host: str, *parts: str) -> str:
        """An absolute folder inside `host`'s run dir (created), for what a client writes."""
        self._pool.add_hosts(plan.hosts)
        t = self._pool[host]
        path = t.resolve(posixpath.join(plan.host(host).run_dir, *parts))
        r = t.run(["mkdir", "-p", "--", path], timeout_s=60)
        if not r.ok:
            raise DeployError(f"could not create {path} on {host}: {r.stderr.strip()}")
        return path

    def run_on(
        self, plan: Plan, host: str, argv: list[str], *, env: dict[str, str], timeout_s: float
    ) -> CommandResult:
        """Run a command to completion on `host` (a benchmark client), its output returned."""
        self._pool.add_hosts(plan.hosts)
        return self._pool[host].run(argv, env=env, timeout_s=timeout_s)

    def read_on(self, plan: Plan, host: str, path: str) -> bytes:
        """A file from `host` (a client's results); FileNotFoundError if it is not there."""
        self._pool.add_hosts(plan.hosts)
        return self._pool[host].read(path)

    def follow(self, log: LogTail) -> Iterator[str]:
        """What is appended to `log` from now on, until the caller stops iterating."""
        return logs.follow(self._pool[log.host], log.path)


def problems(result: DownResult) -> list[str]:
    """What a `down` left behind, one sentence each."""
    out = list(result.containers_left)
    if result.stop.leftover:
        out.append("still running: " + ", ".join(o.name for o in result.stop.leftover))
    for host, ports in result.stop.busy_ports.items():
        out.append(
            f"ports {', '.join(map(str, ports))} still listening on {host} "
            "(another process holds them: `ss -ltnp` shows which)"
        )
    return out
