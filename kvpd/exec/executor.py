"""The executor: the only code that starts and stops a deployment's processes (up/down/status)."""

from __future__ import annotations

import posixpath
import threading
import time
from collections.abc import Callable, Mapping

from kvpd.errors import DeployError, HealthTimeout, KvpdError, StateError
from kvpd.exec import logs, run_dirs
from kvpd.exec.bundle.installer import install_bundle
from kvpd.exec.containers.life import remove_containers, start_containers
from kvpd.exec.diagnose import causes as diagnose
from kvpd.exec.fanout import Fanout
from kvpd.exec.pool import TransportPool
from kvpd.exec.processes import readiness, sweep
from kvpd.exec.processes.health import ProbeResult, probe
from kvpd.exec.processes.status import ProcessStatus, query_status
from kvpd.exec.processes.stop import DownResult, Stopper, StopResult, is_running
from kvpd.exec.records.model import controller_id, launch_digest
from kvpd.exec.records.writer import RecordSync
from kvpd.exec.report import NullReporter, Reporter
from kvpd.exec.state import DeploymentState, ProcessRecord, StateStore
from kvpd.exec.transport import Transport
from kvpd.exec.write_files import write_files
from kvpd.plan.value import Plan, ProcessSpec
from kvpd.profile.roles import Role

DEFAULT_GRACE_S = 20.0


class _ProcessFailed(Exception):
    def __init__(self, spec: ProcessSpec, reason: str, *, timeout: bool = False) -> None:
        super().__init__(reason)
        self.spec = spec
        self.reason = reason
        self.timeout = timeout


class Executor:
    """Runs a Plan through transports. `clock`/`sleep` are injectable so tests of deadlines
    run instantly; `wall` is Unix time for the records."""

    def __init__(
        self,
        transports: Mapping[str, Transport] | TransportPool,
        reporter: Reporter | None = None,
        *,
        store: StateStore | None = None,
        grace_s: float = DEFAULT_GRACE_S,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        wall: Callable[[], float] = time.time,
        max_workers: int = 16,
        probe_timeout_s: float = 2.0,
        log_tail_lines: int = 30,
        serial: bool = False,
    ) -> None:
        """`serial`: bring a stage up one host at a time (that host's processes started and
        healthy before the next host's start) with one worker, i.e. by hand, as a baseline."""
        # Hosts of an older state may be missing from `transports`: the pool opens those.
        self.transports = (
            transports
            if isinstance(transports, TransportPool)
            else TransportPool([], given=dict(transports))
        )
        self.reporter = reporter or NullReporter()
        self.store = store or StateStore()
        self.grace_s = grace_s
        self.clock = clock
        self.sleep = sleep
        self.wall = wall
        self.max_workers = max_workers
        self.probe_timeout_s = probe_timeout_s
        self.log_tail_lines = log_tail_lines
        self.serial = serial
        self._lock = threading.Lock()  # guards the state being built and its saving
        self.records = RecordSync(self.transports, self._lock)  # each host's own record

    # -- up ------------------------------------------------------------------------------

    def up(
        self, plan: Plan, *, profile: str = "", recipe: dict[str, object] | None = None
    ) -> DeploymentState:
        """Refuse a running deployment of `plan`'s name (StateError), then `start` it."""
        self.transports.for_plan(plan)  # before the old record's hosts: `plan`'s specs win
        self.refuse_if_running(plan.deployment, profile or plan.deployment)
        return self.start(plan, profile=profile, recipe=recipe)

    def start(
        self, plan: Plan, *, profile: str = "", recipe: dict[str, object] | None = None
    ) -> DeploymentState:
        """Start every process stage by stage, each stage gated on health. On any failure,
        stop what this run started and raise DeployError (HealthTimeout for deadlines).
        Nothing is refused here: `up` refuses a running deployment first, and the deployment
        service starts only what its `prepare` verified. `recipe`: how the plan was built
        (kept in the cache, see DeploymentState.recipe)."""
        self.transports.for_plan(plan)
        state = DeploymentState(
            deployment=plan.deployment,
            profile_digest=plan.profile_digest,
            plan=plan,
            profile=profile,
            started_by=controller_id(),
            recipe=dict(recipe or {}),
        )
        self._save(state)
        with Fanout(1 if self.serial else self.max_workers) as pool:
            try:
                start_containers(plan, self.transports, self.reporter)
                self._resolve_run_dirs(state, pool)
                write_files(state, self.transports, self.reporter, pool)
                # kvpd on every host slot of the plan (node bundle), verified, before any start
                state.bundle = install_bundle(plan, state.run_dirs, self.transports, self.reporter)
                for stage in plan.stages:
                    for batch in self._batches(stage):
                        records = self._start_stage(state, batch, pool)
                        self._wait_stage(batch, records, pool)
                    self._save(state)
            except BaseException as e:  # noqa: BLE001 - Ctrl-C too rolls back, then re-raises
                raise self._roll_back(state, e, pool) from None
        state.status = "up"
        self._save(state)
        return state

    def _batches(self, stage: list[ProcessSpec]) -> list[list[ProcessSpec]]:
        """The whole stage at once, or (serial) one batch per host in plan order."""
        if not self.serial:
            return [stage]
        by_host: dict[str, list[ProcessSpec]] = {}
        for p in stage:
            by_host.setdefault(p.host, []).append(p)
        return list(by_host.values())

    def close(self) -> None:
        """Close the transports the executor opened itself (never the ones it was given)."""
        self.transports.close()

    def refuse_if_running(self, deployment: str, profile: str) -> None:
        old = self.store.load(deployment)
        if old is None:
            return
        self.transports.for_plan(old.plan)
        running = [r.name for r in old.processes if self._safe_running(r)]
        if running:
            raise StateError(
                f"deployment {deployment!r} is already running ({len(running)} processes: "
                f"{', '.join(running)}). Stop it first: kvpd down {old.profile or profile}"
            )

    def _safe_running(self, rec: ProcessRecord) -> bool:
        try:
            return is_running(self.transports[rec.host], rec)
        except Exception:  # noqa: BLE001 - unknown counts as running: never start twice
            return True

    def _save(self, state: DeploymentState) -> None:
        with self._lock:
            self.store.save(state)

    def _resolve_run_dirs(self, state: DeploymentState, pool: Fanout) -> None:
        hosts = {p.host for p in state.plan.processes} | {f.host for f in state.plan.files}
        specs = [state.plan.host(h) for h in sorted(hosts)]
        dirs = pool.map(lambda h: self.transports[h.name].resolve(h.run_dir), specs)
        state.run_dirs = {h.name: d for h, d in zip(specs, dirs, strict=True)}
        self._save(state)

        def mark(h: str) -> None:  # the run dir, then the index naming it (records/hostio.py)
            run_dirs.mark(self.transports[h], state.run_dirs[h], state.deployment)
            self.records.index(state, h)

        pool.map(mark, sorted(state.run_dirs))

    def _start_stage(
        self, state: DeploymentState, stage: list[ProcessSpec], pool: Fanout
    ) -> list[tuple[ProcessRecord, float]]:
        try:  # every start finishes (and is recorded) before an error reaches the rollback
            return pool.map(lambda p: self._start_one(state, p), stage)
        finally:
            with self._lock:  # records in plan order (they were appended as starts finished)
                order = {p.name: i for i, p in enumerate(state.plan.processes)}
                state.processes.sort(key=lambda r: (r.stage, order.get(r.name, len(order))))

    def _start_one(self, state: DeploymentState, p: ProcessSpec) -> tuple[ProcessRecord, float]:
        t, run_dir = self.transports[p.host], state.run_dirs[p.host]
        self.reporter.process(p.name, "starting", host=p.host)
        log = logs.log_path(run_dir, p)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(self.wall()))
        header = f"{diagnose.HEADER_PREFIX}{state.deployment}/{p.name} started {stamp} ==="
        try:
            t.append(log, header + "\n")
        except (KvpdError, OSError) as e:
            raise _ProcessFailed(p, f"could not create its log {log}: {e}") from e
        env = dict(p.env) | {sweep.DEPLOYMENT_ENV: state.deployment, sweep.PROCESS_ENV: p.name}
        try:
            s = t.start_detached(
                ["bash", posixpath.join(run_dir, p.script)], log=log, cwd=run_dir, env=env
            )
        except KvpdError as e:
            raise _ProcessFailed(p, f"could not be started: {e}") from e
        except OSError as e:  # LocalTransport: e.g. a missing executable or run dir
            raise _ProcessFailed(p, f"could not be started: {e}") from e
        rec = ProcessRecord(
            name=p.name,
            host=p.host,
            stage=p.stage,
            pid=s.pid,
            pgid=s.pgid,
            start_ticks=s.start_ticks,
            ports=list(p.ports),
            log=log,
            started_at=self.wall(),
            role=Role(p.role),
            devices=list(p.devices),
            launch_digest=launch_digest(state.plan, p),
        )
        with self._lock:  # record before anything else can fail: `down` must know it
            state.processes.append(rec)
            self.store.save(state)
        try:  # and on its host, where any controller finds it
            self.records.sync(state, p.host)
        except Exception as e:  # a process no record names must not stay up: roll back
            raise _ProcessFailed(p, f"started, but its host record was not written: {e}") from e
        return rec, self.clock()

    def _wait_stage(
        self,
        stage: list[ProcessSpec],
        started: list[tuple[ProcessRecord, float]],
        pool: Fanout,
    ) -> None:
        specs = {p.name: p for p in stage}
        pending = list(started)
        line_read: dict[str, float] = {}  # when each process's last log line was read
        while pending:
            round_start = self.clock()
            due = readiness.log_lines_due(
                [(r.name, t0) for r, t0 in pending], line_read, round_start
            )
            asks = [(rec, rec.name in due) for rec, _ in pending]
            checks = pool.map(lambda a: self._check(specs[a[0].name], a[0], a[1]), asks)
            now, still = self.clock(), []
            for (rec, t0), (alive, pr, line) in zip(pending, checks, strict=True):
                spec, elapsed = specs[rec.name], now - t0
                if not alive:  # checked first: a foreign server may answer on a clashing port
                    last = f" (last probe: {pr.detail})" if pr else ""
                    raise _ProcessFailed(spec, f"exited before becoming healthy{last}")
                if pr is None or pr.ok:
                    rec.status = "healthy"
                    detail = "no health check" if pr is None else pr.detail
                    self.reporter.process(
                        rec.name, "healthy", host=rec.host, detail=detail, elapsed_s=elapsed
                    )
                    continue
                assert spec.health is not None
                if elapsed >= spec.health.timeout_s:
                    raise _ProcessFailed(
                        spec,
                        f"did not become healthy within {spec.health.timeout_s:g}s "
                        f"(GET {spec.health.url} -> {pr.detail})",
                        timeout=True,
                    )
                if line is not None:
                    # a slow start is not a hung one: show what the engine is doing
                    self.reporter.process(
                        rec.name,
                        "initialising",
                        host=rec.host,
                        detail=f"limit {spec.health.timeout_s:g}s; log: {line}",
                        elapsed_s=elapsed,
                    )
                elif rec.name not in line_read:
                    self.reporter.process(
                        rec.name, "waiting", host=rec.host, detail=pr.detail, elapsed_s=elapsed
                    )
                still.append((rec, t0))
            pending = still
            if pending:
                # The interval is the polling period: a round's own SSH and HTTP time (often
                # 0.1 s over many hosts) must not add up into every stage's bring-up time.
                every = min(specs[r.name].health.interval_s for r, _ in pending)  # type: ignore[union-attr]
                self.sleep(max(0.0, every - (self.clock() - round_start)))

    def _check(
        self, spec: ProcessSpec, rec: ProcessRecord, read_line: bool = False
    ) -> tuple[bool, ProbeResult | None, str | None]:
        """Alive, the health probe, and (when asked) the last line of the process's log."""
        t = self.transports[rec.host]
        pr = probe(t, spec.health, timeout_s=self.probe_timeout_s) if spec.health else None
        alive = t.alive(rec.pid, start_ticks=rec.start_ticks)
        if alive and pr is not None and not pr.ok and spec.health is not None:
            pr = readiness.ready_without_endpoint(t, spec.health, rec.log) or pr
        line = None
        if read_line and alive and pr is not None and not pr.ok:
            line = readiness.last_log_line(t, rec.log)
        return alive, pr, line

    def _roll_back(self, state: DeploymentState, err: BaseException, pool: Fanout) -> BaseException:
        """Stop what this run started; return the exception `up` raises."""
        msg = self._failure_message(state, err)
        if isinstance(err, _ProcessFailed):
            rec = state.record(err.spec.name)
            if rec is not None:
                rec.status = "failed"
        result = self._stop_all(state, pool)
        if not result.leftover:  # containers kvpd started: removed once nothing runs inside
            for problem in remove_containers(state.plan, self.transports, self.reporter):
                self.reporter.message(problem)
        state.status = "failed"
        self._save(state)
        if isinstance(err, _ProcessFailed):  # last, so the rollback's lines do not hide it
            self.reporter.process(err.spec.name, "failed", host=err.spec.host, detail=err.reason)
        if result.leftover:
            names = ", ".join(f"{o.name} ({o.how}: {o.detail})" for o in result.leftover)
            retry = state.profile or state.deployment
            msg += f"\nCould NOT stop: {names}. Retry: kvpd down {retry}"
        else:
            msg += f"\nEverything this run started ({len(result.outcomes)} processes) is stopped."
        if isinstance(err, _ProcessFailed):
            return (HealthTimeout if err.timeout else DeployError)(msg)
        if isinstance(err, Exception):
            return DeployError(msg)
        return err  # KeyboardInterrupt / SystemExit: re-raised as they were, after the rollback

    def _failure_message(self, state: DeploymentState, err: BaseException) -> str:
        if not isinstance(err, _ProcessFailed):
            return f"up of {state.deployment!r} failed: {str(err) or type(err).__name__}"
        spec, rec = err.spec, state.record(err.spec.name)
        log = None if rec is None else (rec.log, rec.host, self._read_tail(rec))
        return diagnose.failure_report(
            spec.name, spec.host, spec.ports, err.reason, log, self.log_tail_lines
        )

    def _read_tail(self, rec: ProcessRecord) -> str:
        try:
            return logs.tail(self.transports[rec.host], rec.log, 400, timeout_s=15)
        except Exception as e:  # noqa: BLE001 - the failure message matters more than its tail
            return f"(could not read the log: {e})"

    # -- down / status -------------------------------------------------------------------

    def _stopper(self, pool: Fanout) -> Stopper:
        """The one way this executor stops processes: rollback and `down` alike."""
        return Stopper(
            self.transports,
            self.reporter,
            pool,
            grace_s=self.grace_s,
            clock=self.clock,
            sleep=self.sleep,
        )

    def _stop_all(self, state: DeploymentState, pool: Fanout) -> StopResult:
        """Stop every recorded process; those gone are `stopped` (a `failed` one keeps its
        word), and each host's record then names only what is left (none: removed)."""
        stopper = self._stopper(pool)
        result = stopper.stop(list(state.processes))
        sweep.stop_unrecorded(stopper, state, result)  # sessions a killed `up` left unrecorded
        for o in result.outcomes:
            rec = state.record(o.name)
            if rec is not None and o.gone and rec.status != "failed":
                rec.status = "stopped"
        gone = {o.name for o in result.outcomes if o.gone}
        for problem in self.records.sync_all(state, pool.map, gone):
            self.reporter.message(problem)
        return result

    def down(self, state: DeploymentState) -> DownResult:
        """Stop every recorded process (reverse stage order), verify they and their ports are
        gone, and record the outcome. Idempotent; works on the state of a killed `up`."""
        self.transports.for_plan(state.plan)
        state.status = "stopping"
        self._save(state)
        with Fanout(self.max_workers) as pool:
            result = self._stop_all(state, pool)
        left: list[str] = []
        if not result.leftover:  # containers kvpd started: once nothing runs inside
            left = remove_containers(state.plan, self.transports, self.reporter)
        state.status = "down" if not result.leftover and not left else "stopping"
        self._save(state)
        return DownResult(state.deployment, result, left)

    def status(self, state: DeploymentState) -> list[ProcessStatus]:
        """Each recorded process: alive, healthy (one quick probe), uptime, listening ports."""
        self.transports.for_plan(state.plan)
        with Fanout(self.max_workers) as pool:
            return query_status(state, self.transports, pool, self.wall(), self.probe_timeout_s)
