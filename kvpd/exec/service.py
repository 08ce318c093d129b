"""The deployment service: the one way the CLI and bench act on deployments.

`with Deployments(...) as svc:` holds one transport pool for everything done inside (each host
is connected once, and closed once at the end); every operation returns a value the caller
renders. Nothing here prints.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType, TracebackType

from kvpd.errors import DeployError, StateError
from kvpd.exec import logs
from kvpd.exec.checks import Check
from kvpd.exec.container_life import remove_containers, start_containers
from kvpd.exec.executor import DEFAULT_GRACE_S, DownResult, Executor, ProcessStatus
from kvpd.exec.preflight import run_checks
from kvpd.exec.purge import purge_run_dirs
from kvpd.exec.state import DeploymentState, ProcessRecord, StateStore
from kvpd.exec.stop import NullReporter, Reporter
from kvpd.exec.transport import Transport
from kvpd.exec.transports import TransportPool
from kvpd.plan.model import Plan


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


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM (e.g. a CI timeout) takes the same path as Ctrl-C: `up` rolls back, then the
    exception propagates. Signal handlers can only be set from the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


class Deployments:
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
        # Containers kvpd starts must run before preflight can look inside (issue 16); when
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
        with sigterm_as_interrupt():
            return self._executor(reporter).up(plan, profile=profile, refuse_running=False)

    def down(self, deployment: str, reporter: Reporter | None = None) -> DownResult | None:
        """Stop every recorded process of `deployment`; None when it has no state."""
        state = self.store.load(deployment)
        if state is None:
            return None
        return self._executor(reporter).down(state)

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

    # -- inspecting --------------------------------------------------------------------

    def status(self, deployment: str) -> tuple[DeploymentState, list[ProcessStatus]]:
        """The recorded state and each process: alive, healthy, uptime, ports."""
        state = self.store.require(deployment)
        return state, self._executor().status(state)

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
