"""One `kvpd bench` run: scenarios (restarting the deployment), sweep points and protocol phases,
each phase bracketed by /metrics scrapes of every engine and the proxy."""

from __future__ import annotations

import datetime as _dt
import functools
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from kvpd.bench import (
    canary,
    freshness,
    lengths,
    logcheck,
    output_check,
    proof,
    runner,
    serve_output,
)
from kvpd.bench import metrics as m
from kvpd.bench.records import BenchRun, Record
from kvpd.bench.settings import Point, Scenario, Settings
from kvpd.errors import BenchError, KvpdError, StateError
from kvpd.exec import client_key
from kvpd.exec.diagnose.causes import current_run
from kvpd.exec.processes.health import probe
from kvpd.exec.service import Deployments
from kvpd.plan.value import HealthCheck, Plan
from kvpd.profile.bench_schema import CacheCheck
from kvpd.profile.roles import Role

# How much of each engine's log the confirmations read (a line per request at most).
LOG_LINES = 20000


class Progress(Protocol):
    def start(self, total_phases: int) -> None: ...
    def status(self, text: str) -> None: ...
    def phase(self, scenario: str, point: Point, phase: str) -> None: ...
    def advance(self) -> None: ...


class NullProgress:
    def start(self, total_phases: int) -> None:
        pass

    def status(self, text: str) -> None:
        pass

    def phase(self, scenario: str, point: Point, phase: str) -> None:
        pass

    def advance(self) -> None:
        pass


def is_disaggregated(plan: Plan) -> bool:
    roles = {p.role for p in plan.processes}
    return Role.PREFILL in roles and Role.DECODE in roles


@dataclass
class Target:
    """Where the phases go: the proxy, the model name, and the /metrics endpoints."""

    plan: Plan
    base_url: str
    model: str
    tokenizer: str
    metrics: list[m.Target] = field(default_factory=list)
    verify: bool = False  # run the output check after each phase


@dataclass
class Session:
    profile: str
    settings: Settings
    scenarios: list[Scenario]  # empty: bench the running deployment as it is
    out_dir: Path
    service: Deployments  # starts and stops the deployment between scenarios
    load: Callable[[list[str]], Plan]  # the profile's plan with these --set overrides
    user_sets: list[str] = field(default_factory=list)
    vllm: str = ""
    tokenizer: str = ""  # override of the plan's tokenizer (bench runs on this machine)
    phase_timeout_s: float = 3600.0
    restore: bool = True  # bring the original deployment back after scenarios
    keep_up: bool = False  # leave the last scenario running
    prove_restarts: bool = True  # the canary after each scenario's restart, as `kvpd up` runs
    progress: Progress = field(default_factory=NullProgress)
    run_client: Callable[..., runner.RunOutput] = runner.run
    verify_outputs: bool | None = None  # None: output_check.bench_default
    post: output_check.Post | None = None  # the output check's HTTP (None: canary.poster)
    prompt_salt: int | None = None  # None: a new one per run (kvpd.bench.freshness)
    client_where: str = "this machine"  # where run_client runs `vllm bench serve`

    def run(self) -> BenchRun:
        base = self.load(self.user_sets)
        run = BenchRun(
            profile=self.profile,
            deployment=base.deployment,
            plan_digest=base.profile_digest,
            protocol=self.settings.protocol,
            created=_dt.datetime.now().isoformat(timespec="seconds"),
            settings={**asdict(self.settings), "points": [asdict(p) for p in self.settings.points]},
            scenarios=[
                {"name": s.name, "sets": list(s.sets), "cache": s.cache, "without": list(s.without)}
                for s in self.scenarios
            ],
            out_dir=str(self.out_dir),
            client=self.client_where,
        )
        if self.prompt_salt is None:
            self.prompt_salt = freshness.new_salt()
        run.settings["prompt_salt"] = self.prompt_salt
        run.settings["prompt_seeds"] = {}
        phases_per_point = 2 if self.settings.protocol in ("prefix", "twice") else 1
        n_scen = max(1, len(self.scenarios))
        self.progress.start(n_scen * len(self.settings.points) * phases_per_point)
        if not self.scenarios:
            target = self._current_target(base)
            target.verify = self._verify(target.plan, restarted=False)
            self._run_points("as-is", target, run, cache=None)
            self._confirm("as-is", target.plan, run, None)
            return run
        was_running = self.service.running(base.deployment) is not None
        started = False
        try:
            for scn in self.scenarios:
                self.progress.status(f"scenario {scn.name}: restarting {base.deployment}")
                try:
                    self._stop(base.deployment)
                    # the scenario's plan is the deployment under test; the profile's scenarios
                    # (checked against the deployment as written) do not apply to it
                    plan = self.load([*self.user_sets, *scn.sets, "bench.scenarios={}"])
                    started = True
                    state = self.service.up(plan, profile=self.profile)
                    self._prove(scn.name, state.plan)
                except KvpdError as e:
                    run.failures.append(f"scenario {scn.name!r}: the deployment did not start: {e}")
                    for _ in range(len(self.settings.points) * phases_per_point):
                        self.progress.advance()
                    continue
                target = self._target(state.plan)
                target.verify = self._verify(state.plan, restarted=True)
                self._run_points(scn.name, target, run, cache=scn.cache)
                self._confirm(scn.name, state.plan, run, scn.cache)
        finally:
            if started and not self.keep_up:
                self.progress.status(f"stopping {base.deployment}")
                self._stop(base.deployment)
                if was_running and self.restore:
                    self.progress.status(f"restoring {base.deployment} as it was")
                    try:
                        self.service.up(base, profile=self.profile)
                    except KvpdError as e:
                        run.failures.append(f"could not restore the deployment: {e}")
        return run

    def _prove(self, scenario: str, plan: Plan) -> None:
        """The canary `kvpd up` ends with, on the deployment a scenario restarted: P/D proven
        before anything is measured, and no engine's first batch is the benchmark's. A fresh
        vLLM CPU decoder whose first batch was a seeding prompt it loaded from the store (256
        tokens loaded, a few computed) died in its attention kernel (SIGILL in
        cpu_attention_with_kv_cache, on this AMX machine) in every such restart; after the
        canary's requests the same prompt is served. The outputs are checked by the phases."""
        if not self.prove_restarts or not canary.applies(plan):
            return
        self.progress.status(f"scenario {scenario}: canary through the proxy")
        got = self.service.canary(plan, functools.partial(canary.run, verify_outputs=False))
        if not got.ok:
            raise BenchError(
                f"the canary through the proxy failed: {'; '.join(got.problems) or got.line}. "
                f"See `kvpd logs {self.profile}`."
            )

    def _verify(self, plan: Plan, *, restarted: bool) -> bool:
        if self.verify_outputs is not None:
            return self.verify_outputs
        return output_check.bench_default(plan, restarted=restarted)

    def _stop(self, deployment: str) -> None:
        try:
            self.service.stop(deployment)
        except StateError as e:
            raise BenchError(
                f"could not stop deployment {deployment!r} between scenarios ({e}). "
                f"Run `kvpd down {self.profile}` and check `kvpd status`."
            ) from e

    def _confirm(self, scenario: str, plan: Plan, run: BenchRun, cache: CacheCheck | None) -> None:
        """The guides' log confirmations (layerwise reuse, store hits) for this scenario."""
        if not plan.log_checks:
            return

        def read(process: str) -> str | None:
            try:
                text = self.service.logs(process, deployment=plan.deployment, lines=LOG_LINES).text
                return current_run(text)  # logs append across restarts: this start only
            except (KvpdError, OSError):
                return None

        self.progress.status(f"scenario {scenario}: reading engine logs")
        got = logcheck.confirm(scenario, plan.log_checks, read, cache)
        run.notes += got.notes
        run.failures += got.problems

    # -- targets -------------------------------------------------------------------------

    def _target(self, plan: Plan) -> Target:
        if not plan.proxy_url:
            raise BenchError(
                f"deployment {plan.deployment!r} has no proxy URL to benchmark (profile without "
                "a proxy and without a mixed engine?)."
            )
        return Target(
            plan=plan,
            base_url=plan.proxy_url,
            model=plan.served_model,
            tokenizer=self.tokenizer or plan.tokenizer,
            metrics=m.targets(plan),
        )

    def _current_target(self, base: Plan) -> Target:
        """The running deployment (its recorded plan), or the profile's plan when its proxy
        answers although kvpd did not start it."""
        state = self.service.store.load(base.deployment)
        plan = state.plan if state is not None and state.status == "up" else base
        target = self._target(plan)
        health = HealthCheck(target.base_url.rstrip("/") + "/health")
        proxy = next((p for p in plan.processes if p.role == Role.PROXY and p.health), None)
        if proxy is not None and proxy.health is not None:
            health = proxy.health
        host = plan.proxy_host or (plan.hosts[0].name if plan.hosts else "")
        pr = probe(self.service.transports(plan)[host], health, timeout_s=5.0)
        if not pr.ok:
            raise BenchError(
                f"deployment {base.deployment!r} is not serving: {health.url} -> {pr.detail}. "
                f"Start it with `kvpd up {self.profile}`, or give --scenario so that bench "
                "starts it."
            )
        return target

    # -- phases --------------------------------------------------------------------------

    def _run_points(
        self, scenario: str, target: Target, run: BenchRun, *, cache: CacheCheck | None
    ) -> None:
        from kvpd.bench.runner import protocol_phases

        s = self.settings
        for point in s.points:
            seed = freshness.fresh_seed(s.seed, self.prompt_salt or 0, scenario, point.key)
            run.settings["prompt_seeds"][f"{scenario}/{point.key}"] = seed
            phases = protocol_phases(
                s.protocol,
                input_len=point.input_len,
                output_len=point.output_len,
                num_prompts=s.num_prompts,
                seed=seed,
                request_rate=point.request_rate,
                max_concurrency=point.max_concurrency,
                ignore_eos=s.ignore_eos,
                prefix_ratio=s.prefix_ratio,
            )
            for ph in phases:
                self.progress.phase(scenario, point, ph.name)
                rec = self._run_phase(scenario, point, ph, target, run, cache)
                run.records.append(rec)
                self.progress.advance()

    def _run_phase(
        self,
        scenario: str,
        point: Point,
        ph: runner.Phase,
        target: Target,
        run: BenchRun,
        cache: CacheCheck | None,
    ) -> Record:
        result_dir = self.out_dir / "raw" / scenario
        result_dir.mkdir(parents=True, exist_ok=True)
        stem = f"{point.key}-{ph.name}"
        argv = runner.build_argv(
            self.vllm,
            ph,
            base_url=target.base_url,
            model=target.model,
            tokenizer=target.tokenizer,
            result_dir=str(result_dir),
            result_filename=f"{stem}.json",
            metadata={
                "kvpd_profile": self.profile,
                "kvpd_deployment": run.deployment,
                "kvpd_plan_digest": target.plan.profile_digest,
                "kvpd_scenario": scenario,
                "kvpd_protocol": run.protocol,
                "kvpd_prompt_seed": str(ph.seed),
            },
        )
        env = runner.client_env(target.tokenizer, target.base_url, result_dir / ".cache")
        key = client_key.read(target.plan)
        if key:  # `vllm bench serve` sends OPENAI_API_KEY as its bearer token (env, not argv)
            env["OPENAI_API_KEY"] = key
        hosts = self.service.transports(target.plan)
        before = m.scrape(target.metrics, hosts)
        t0 = time.monotonic()
        out = self.run_client(
            argv,
            env=env,
            log=result_dir / f"{stem}.log",
            timeout_s=self.phase_timeout_s,
        )
        after = m.scrape(target.metrics, hosts)
        delta = m.delta(target.metrics, before, after)
        raw_path = result_dir / f"{stem}.json"
        raw: dict[str, Any] = {}
        if raw_path.is_file():
            try:
                raw = serve_output.load_json(raw_path)
            except ValueError:
                raw = {}
        result = serve_output.merge(raw, serve_output.parse_stdout(out.stdout))
        rec = Record(
            scenario=scenario,
            phase=ph.name,
            measured=ph.measured,
            input_len=ph.input_len,
            output_len=ph.output_len,
            max_concurrency=ph.max_concurrency,
            request_rate=ph.request_rate,
            num_prompts=ph.num_prompts,
            result=result,
            metrics=delta.to_dict(),
            raw_file=str(raw_path) if raw else "",
            log=out.log,
            seconds=round(time.monotonic() - t0, 3),
        )
        if out.timed_out:
            rec.problems.append(
                f"scenario {scenario!r}, phase {ph.name}: vllm bench serve did not finish in "
                f"{self.phase_timeout_s:g}s (log: {out.log})."
            )
        elif out.returncode != 0:
            tail = "\n    ".join(out.tail[-8:])
            rec.problems.append(
                f"scenario {scenario!r}, phase {ph.name}: vllm bench serve exited with "
                f"{out.returncode} (log: {out.log}):\n    {tail}"
            )
        else:
            where = f"scenario {scenario!r}, phase {ph.name}"
            rec.problems += lengths.problems(where, raw, output_len=ph.output_len,
                                             ignore_eos=ph.ignore_eos)  # fmt: skip
            rec.problems += proof.check_phase(
                scenario=scenario,
                phase=ph.name,
                measured=ph.measured,
                protocol=run.protocol,
                disaggregated=is_disaggregated(target.plan),
                cache=cache,
                result=result,
                delta=delta,
                prefix_ratio=self.settings.prefix_ratio,
                input_len=ph.input_len,
            )
            if target.verify and ph.measured:  # not after seeding: keep its caches as left
                self._check_outputs(where, target, rec)
        return rec

    def _check_outputs(self, where: str, target: Target, rec: Record) -> None:
        """After the phase (outside its /metrics window): P/D output vs a reference engine."""
        self.progress.status(f"{where}: checking outputs")
        hosts = self.service.transports(target.plan)
        key = client_key.read(target.plan)
        post = self.post or canary.poster(target.plan, hosts, key)
        report = output_check.run(target.plan, post, canary.prompt, hosts,
                                  timeout_s=min(120.0, self.phase_timeout_s))  # fmt: skip
        rec.outputs = report.to_dict()
        rec.problems += report.problems(where)
