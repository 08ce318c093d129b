"""The deployment service: the one way the CLI and bench act on deployments.

`with Deployments(...) as svc:` holds one transport pool for everything done inside (each host
is connected once, and closed once at the end); every operation returns a value the caller
renders. Nothing here prints.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import TracebackType

from kvpd.errors import DeployError, StateError
from kvpd.exec import admin_token, client_key, rolling
from kvpd.exec.containers.life import remove_containers, start_containers
from kvpd.exec.executor import DEFAULT_GRACE_S, Executor
from kvpd.exec.fanout import Fanout
from kvpd.exec.interrupts import sigterm_as_interrupt
from kvpd.exec.lease.scope import Leasing, leased
from kvpd.exec.pool import TransportPool
from kvpd.exec.preflight.checks import Check
from kvpd.exec.preflight.run import run_checks
from kvpd.exec.processes import supervised, sweep
from kvpd.exec.processes.stop import DownResult
from kvpd.exec.processes.supervised import Supervised
from kvpd.exec.proxy_admin import ProxyAdmin
from kvpd.exec.purge import purge_run_dirs
from kvpd.exec.records.current import Current
from kvpd.exec.report import NullReporter, Reporter
from kvpd.exec.rolling import CanaryCheck, CanaryOutcome, Roller, Step
from kvpd.exec.service_inspect import Inspecting
from kvpd.exec.state import DeploymentState, StateStore
from kvpd.exec.transport import Transport
from kvpd.plan.value import Plan
from kvpd.profile.roles import Role


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


@dataclass(frozen=True, eq=False)
class Prepared:
    """What `Deployments.prepare` verified for one plan, handed back to `up`: no deployment of
    its name is running, nothing of another deployment is in the way, and `checks` (the
    preflight, failed ones included; empty when it was skipped). The CLI prepares before its
    prompt (so a running deployment is refused whatever the answer, and the checks are shown
    first), then passes this to `up`, which so neither refuses nor checks again; without it
    `up` prepares itself. Made by `prepare` only, so holding one means the checks ran."""

    plan: Plan
    checks: tuple[Check, ...]

    @property
    def ok(self) -> bool:
        """Every preflight check passed (or none ran)."""
        return all(c.ok for c in self.checks)


@leased(up="up", down="down", restart="restart", roll="restart")
class Deployments(Inspecting, Leasing):
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
        self.seen: Current | None = None  # what the hosts recorded at the last look
        self.cached: DeploymentState | None = None  # the local cache at that look
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

    # -- before up ---------------------------------------------------------------------

    def check(self, plan: Plan) -> list[Check]:
        """The read-only preflight checks on every host of `plan` (see exec/preflight/run.py)."""
        return run_checks(plan, self.transports(plan).__getitem__)

    def prepare(self, plan: Plan, *, profile: str, preflight: bool = True) -> Prepared:
        """What `up` verifies before it starts anything: the deployment is not running
        (StateError), nothing else is in the way (StateError) and, with `preflight`, the
        checks, kept in the result (failed ones included) so the caller can show them before
        asking to go on."""
        self._executor().refuse_if_running(plan.deployment, profile or plan.deployment)
        self.refuse_conflicts(plan)
        return Prepared(plan, tuple(self._preflight(plan) if preflight else ()))

    def _preflight(self, plan: Plan) -> list[Check]:
        if not any(h.container and h.container.started_by_kvpd for h in plan.hosts):
            return self.check(plan)
        # Containers kvpd starts must run before preflight can look inside; when
        # a check fails they are removed again (`up` starts them anew if the user goes on).
        start_containers(plan, self.transports(plan), NullReporter())
        checks = self.check(plan)
        if not all(c.ok for c in checks):
            remove_containers(plan, self.transports(plan), NullReporter())
        return checks

    # -- up / down ---------------------------------------------------------------------

    def up(
        self,
        plan: Plan,
        *,
        profile: str = "",
        reporter: Reporter | None = None,
        preflight: bool = True,
        prepared: Prepared | None = None,
        recipe: dict[str, object] | None = None,
    ) -> DeploymentState:
        """Start `plan` stage by stage (see Executor.start); on failure everything started is
        stopped and DeployError raised. `prepared`: what `prepare(plan)` returned, when the
        caller ran it first; else `prepare` runs here (with `preflight`). Either way a running
        deployment has been refused, and failed checks raise PreflightFailed."""
        if prepared is None:
            prepared = self.prepare(plan, profile=profile, preflight=preflight)
        elif prepared.plan is not plan:
            raise ValueError(f"up of {plan.deployment!r} was given what another plan prepared")
        if not prepared.ok:
            raise PreflightFailed(plan, list(prepared.checks))
        events = self.events(plan.deployment)
        plan = client_key.attach(admin_token.issue(plan, self.store.root))
        try:
            with sigterm_as_interrupt():
                state = self._executor(reporter).start(plan, profile=profile, recipe=recipe)
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

    def down(
        self, deployment: str, reporter: Reporter | None = None, *, plan: Plan | None = None
    ) -> DownResult | None:
        """Stop every recorded process of `deployment`; None when nothing records it. With
        `plan`, what the hosts record (validated against `plan`); refused records are named in
        the result and nothing of theirs is signalled."""
        refused: list[str] = []
        if plan is None:
            state = self.store.load(deployment)
        else:
            cur = self.current(plan)
            state, refused = cur.state, list(cur.refused.values())
            # A host no record names may still run a start a killed `up` left unrecorded: its
            # run dir is looked at too (never a host whose record was refused).
            self._plan_run_dirs(state, skip=set(cur.refused) | set(cur.unreachable))
            if not state.processes and not refused and not self._any_unrecorded(state):
                state = None
        if state is None:
            return None
        children = self.supervisors(state)  # read before the supervisors go
        result = self._executor(reporter).down(state)
        result.refused = refused
        self._reap_children(state, children, result)
        self.events(deployment).record(
            "down", "clean" if result.clean else "incomplete: " + "; ".join(problems(result))
        )
        return result

    def _any_unrecorded(self, state: DeploymentState) -> bool:
        pool = self.transports(state.plan)
        with Fanout(8) as fan:
            found, _ = sweep.find_unrecorded(pool, fan.map, state)
        return bool(found)

    def _reap_children(
        self, state: DeploymentState, children: dict[str, Supervised], result: DownResult
    ) -> None:
        """A supervisor forwards the stop to its child; verify the child went with it (and
        kill its group if not: a supervisor killed past its grace leaves it to the kernel's
        PDEATHSIG, which does not reach the engine's own children)."""
        for name, sup in children.items():
            rec = state.record(name)
            if rec is not None and sup.child_pid:
                # down() read `children` through the pool, which so knows their hosts
                outcome = supervised.reap_child(self._pool[rec.host], name, rec.host, sup)
                if outcome is not None:
                    result.stop.outcomes.append(outcome)

    def purge(self, state: DeploymentState) -> dict[str, str]:
        """Remove every host's run dir of a stopped deployment (rendered files, logs, the node
        bundle): host -> why a run dir was kept, for those not removed. Hosts no record names
        (files only, or records already removed by the `down`) get the run dir the plan names,
        as their transport resolves it: the marker still decides what is removed."""
        plan = state.plan
        pool = self.transports(plan)
        for h in sorted({p.host for p in plan.processes} | {f.host for f in plan.files}):
            if h not in state.run_dirs:
                state.run_dirs[h] = pool[h].resolve(plan.host(h).run_dir)
        return purge_run_dirs(state, pool.__getitem__)

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
        plan: Plan | None = None,
    ) -> list[Step]:
        """Rolling restart of `targets` (names or groups; all when empty) of a running
        deployment: for each in turn drain, stop, start, health gate, re-admit, canary (see
        exec/rolling.py), `canary(plan)` after each. Stops at the first failure (DeployError),
        the rest untouched."""
        from_hosts = plan is not None
        state = self._state(deployment, plan)
        plan = state.plan
        pool = self.transports(plan)
        specs = rolling.select(plan, targets)
        if from_hosts and self.seen is not None:
            rolling.refuse_drifted(specs, self.seen)
        admin = None
        if plan.proxy_url and any(p.role == Role.PROXY for p in plan.processes):
            token = admin_token.read(self.store.root, deployment) or self._host_token(state)
            admin = ProxyAdmin(pool[plan.proxy_host], plan.proxy_url, token)
        check = None
        if canary is not None:

            def check() -> tuple[bool, str]:
                r = self.canary(plan, canary)
                return r.ok, r.line

        ex = self._executor(reporter)  # over the same pool, which knows `plan`'s hosts
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


def problems(result: DownResult) -> list[str]:
    """What a `down` left behind, one sentence each."""
    out = list(result.containers_left)
    out += result.refused
    if result.stop.leftover:
        out.append("still running: " + ", ".join(o.name for o in result.stop.leftover))
    for host, ports in result.stop.busy_ports.items():
        out.append(
            f"ports {', '.join(map(str, ports))} still listening on {host} "
            "(another process holds them: `ss -ltnp` shows which)"
        )
    return out
