"""`kvpd bench`: run the guides' `vllm bench serve` protocols through a deployment's proxy."""

from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from kvpd.errors import BenchError, KvpdError
from kvpd.profile.roles import ENGINE_ROLES

if TYPE_CHECKING:
    from kvpd.bench.records import BenchRun
    from kvpd.plan.value import HostSpec, Plan


def bench_cmd(
    profile: str | None = typer.Argument(
        None, help="Profile file or bundled profile name (not needed with --compare)."
    ),
    protocol: str | None = typer.Option(
        None,
        "--protocol",
        help="plain | prefix (seed input x ratio with output 1, then measure) | twice "
        "(cold, then warm). Default: the profile's bench.protocol.",
    ),
    input_len: str | None = typer.Option(
        None, "--input-len", help="Input length(s), comma-separated for a sweep."
    ),
    output_len: str | None = typer.Option(
        None, "--output-len", help="Output length(s), comma-separated for a sweep."
    ),
    concurrency: str | None = typer.Option(
        None, "--concurrency", help="--max-concurrency value(s), comma-separated for a sweep."
    ),
    num_prompts: int | None = typer.Option(None, "--num-prompts", min=1, max=1_000_000),
    request_rate: str | None = typer.Option(None, "--request-rate", help="req/s or inf."),
    seed: int | None = typer.Option(None, "--seed"),
    prefix_ratio: float | None = typer.Option(
        None, "--prefix-ratio", help="Seeded share of the input (prefix protocol)."
    ),
    scenario: list[str] = typer.Option(
        [],
        "--scenario",
        help="Restart the deployment with this variant and bench it; repeat to compare. "
        "NAME from the profile's bench.scenarios or a preset (recompute: no prefix cache "
        "of any kind; hbm: vLLM's prefix cache only; external: as deployed; as-is), or "
        "NAME:field.path=value;... inline. Speedups are against recompute (else the first).",
    ),
    all_scenarios: bool = typer.Option(
        False,
        "--all-scenarios",
        help="Run every scenario of the profile's bench.scenarios (none defined: the "
        "presets recompute, hbm, external).",
    ),
    sets: list[str] = typer.Option(
        [], "--set", help="Override a profile field for every run (field.path=value)."
    ),
    results_dir: Path | None = typer.Option(
        None,
        "--results",
        help="Results folder (default .kvpd/<deployment>/bench/<time>).",
    ),
    stat: str = typer.Option("mean", "--stat", help="Latency shown: mean, median or p99."),
    tokenizer: str | None = typer.Option(
        None, "--tokenizer", help="Tokenizer for the client (default: the plan's)."
    ),
    phase_timeout: float = typer.Option(
        3600.0, "--phase-timeout", help="Seconds one vllm bench serve run may take."
    ),
    keep_up: bool = typer.Option(
        False, "--keep-up", help="After scenarios, leave the last one running."
    ),
    restore: bool = typer.Option(
        True,
        "--restore/--no-restore",
        help="After scenarios, start the deployment again as it was if it was running.",
    ),
    compare: tuple[str, str] | None = typer.Option(
        None, "--compare", help="Print the differences between two saved runs A B."
    ),
    baseline: Path | None = typer.Option(
        None, "--baseline", help="Saved run (folder or results.json) to gate against."
    ),
    max_regression: str | None = typer.Option(
        None,
        "--max-regression",
        help="Largest allowed regression (default 10% with --baseline; with --compare it "
        "gates B against A).",
    ),
    verify_outputs: bool | None = typer.Option(
        None,
        "--verify-outputs/--no-verify-outputs",
        help="After each measured phase, compare greedy completions through the proxy with a "
        "prefill (or mixed) engine's own. Default: on for rehearsals, CPU deployments and "
        "scenarios bench restarts; off for a real cluster benched as it is (the canary of "
        "`kvpd up` checked it).",
    ),
    charts: bool = typer.Option(True, "--charts/--no-charts", help="Write PNG charts."),
    json_out: bool = typer.Option(False, "--json", help="Print the run as JSON."),
) -> None:
    """Benchmark a deployment through its proxy with the real `vllm bench serve`.

    Prints the guide-shaped table (TTFT/TPOT/E2EL per scenario, throughput, speedup) and the proof from /metrics; saves JSON, CSV and charts. Exits non-zero when a phase failed, decode received no KV, an external scenario had no external hits, or a metric regressed beyond --max-regression against --baseline.
    """  # noqa: E501
    if stat not in ("mean", "median", "p99"):
        raise BenchError(f"--stat must be mean, median or p99, not {stat!r}.")
    if compare:
        _compare_runs(compare, max_regression)
        return
    if not profile:
        raise BenchError("give a PROFILE to benchmark (or --compare A B for saved runs).")
    run = _run(
        profile=profile,
        protocol=protocol,
        input_len=input_len,
        output_len=output_len,
        concurrency=concurrency,
        num_prompts=num_prompts,
        request_rate=request_rate,
        seed=seed,
        prefix_ratio=prefix_ratio,
        scenario=scenario,
        all_scenarios=all_scenarios,
        sets=sets,
        results_dir=results_dir,
        tokenizer=tokenizer,
        phase_timeout=phase_timeout,
        keep_up=keep_up,
        restore=restore,
        quiet=json_out,
        verify_outputs=verify_outputs,
    )
    _show_run(run, stat, charts=charts, json_out=json_out)
    _refuse_invalid(run, baseline, max_regression)


def register(app: typer.Typer) -> None:
    app.command("bench")(bench_cmd)


def _compare_runs(compare: tuple[str, str], max_regression: str | None) -> None:
    """`--compare A B`: the differences between two saved runs, gated with --max-regression."""
    from kvpd.bench import compare as cmp
    from kvpd.bench import gate, records
    from kvpd.cli import output

    a, b = records.load(compare[0]), records.load(compare[1])
    gate.refuse_wrong_outputs({compare[0]: a, compare[1]: b})
    output.out.print(cmp.compare_table(a, b, compare[0], compare[1]))
    only_a, only_b = cmp.unmatched(a, b)
    for label in only_a:
        output.err.print(f"only in {compare[0]}: {label}")
    for label in only_b:
        output.err.print(f"only in {compare[1]}: {label}")
    if max_regression is not None:
        gate.gate(a, b, gate.parse_percent(max_regression))


def _show_run(run: BenchRun, stat: str, *, charts: bool, json_out: bool) -> None:
    """Save the run (JSON, CSV, charts) and print it: as JSON, or as the guide's tables."""
    from kvpd.bench import charts as charts_mod
    from kvpd.bench import records, report
    from kvpd.cli import output

    out_dir = Path(run.out_dir)
    json_path, csv_path = records.save(run, out_dir)
    pngs = charts_mod.charts(run, out_dir) if charts and run.measured else []
    if json_out:
        output.print_json(run.to_dict())
        return
    if len(run.measured) == 1:
        output.out.print(report.latency_table(run.measured[0]))
    elif run.measured:
        output.out.print(report.results_table(run, stat))
    if run.records:
        output.out.print(report.proof_table(run))
    for line in report.outputs_lines(run):
        output.out.print(line)
    for note in run.notes:
        output.out.print(f"log: {note}")
    output.out.print(f"Client: vllm bench serve ran on {run.client}")
    output.out.print(f"Results: {json_path}, {csv_path}")
    for p in pngs:
        output.out.print(f"Chart: {p}")


def _refuse_invalid(run: BenchRun, baseline: Path | None, max_regression: str | None) -> None:
    """Exit non-zero for a run that is no valid result, or regressed against `baseline`."""
    from kvpd.bench import gate, records

    problems = run.problems
    gate_problems: list[str] = []
    allowed = gate.parse_percent(max_regression or "10%") if baseline is not None else 0.0
    if baseline is not None:
        base_run = records.load(baseline)
        gate.refuse_wrong_outputs({str(baseline): base_run})
        gate_problems = gate.regressions(base_run, run, allowed)
    if problems or gate_problems:
        lines = [f"  - {p}" for p in problems]
        if gate_problems:
            lines.append(f"  regression gate against {baseline} (max {allowed:.0%}):")
            lines += [f"    - {p}" for p in gate_problems]
        what = "not a valid result" if problems else "regressed"
        raise BenchError(f"bench of {run.deployment!r} {what}:\n" + "\n".join(lines))


def _run(
    *,
    profile: str,
    protocol: str | None,
    input_len: str | None,
    output_len: str | None,
    concurrency: str | None,
    num_prompts: int | None,
    request_rate: str | None,
    seed: int | None,
    prefix_ratio: float | None,
    scenario: list[str],
    all_scenarios: bool,
    sets: list[str],
    results_dir: Path | None,
    tokenizer: str | None,
    phase_timeout: float,
    keep_up: bool,
    restore: bool,
    quiet: bool,
    verify_outputs: bool | None = None,
) -> BenchRun:
    from kvpd.bench.progress import RichProgress
    from kvpd.bench.session import NullProgress, Session
    from kvpd.bench.settings import check_lengths, int_list, make_settings, resolve_scenarios
    from kvpd.cli import output
    from kvpd.exec.service import Deployments
    from kvpd.exec.state import StateStore, state_root
    from kvpd.plan.build import load_plan

    base = load_plan(profile, sets=list(sets))
    # The running deployment's hosts (its recorded plan: started with an inventory, say) are
    # where the client may go; the profile's alone when nothing runs yet.
    recorded = StateStore().load(base.deployment)
    where_to = recorded.plan if recorded is not None and recorded.status == "up" else base
    # where the client runs, decided before anything starts: a missing client is a setup problem
    vllm, client_host = _client(where_to, tokenizer)
    settings = make_settings(
        base.bench,
        protocol=protocol,
        input_lens=int_list(input_len, "--input-len"),
        output_lens=int_list(output_len, "--output-len"),
        concurrencies=int_list(concurrency, "--concurrency"),
        num_prompts=num_prompts,
        request_rate=request_rate,
        seed=seed,
        prefix_ratio=prefix_ratio,
    )
    names = list(scenario)
    if all_scenarios:
        # the profile's own, else the guide's three presets
        defined = list(base.bench.scenarios) or ["recompute", "hbm", "external"]
        names += [n for n in defined if n not in names]
    connectors, max_len = _profile_facts(profile, sets)
    check_lengths(settings, max_len)
    scenarios = resolve_scenarios(names, base.bench, connectors)
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out_dir = results_dir or state_root() / base.deployment / "bench" / stamp
    session = Session(
        profile=profile,
        settings=settings,
        scenarios=scenarios,
        out_dir=Path(out_dir),
        service=Deployments(),
        load=lambda more: load_plan(profile, sets=more),
        user_sets=list(sets),
        vllm=vllm,
        tokenizer=tokenizer or "",
        phase_timeout_s=phase_timeout,
        restore=restore,
        keep_up=keep_up,
        verify_outputs=verify_outputs,
    )
    from kvpd.bench.remote import RemoteClient, where

    session.client_where = where(where_to, client_host)
    if client_host is not None:
        session.run_client = RemoteClient(
            session.service, where_to, client_host, Path(out_dir).name, vllm
        )
        if not quiet:
            output.err.print(f"vllm bench serve runs on {session.client_where}")
    with session.service:
        if quiet:
            session.progress = NullProgress()
            return session.run()
        with RichProgress(output.err) as progress:
            session.progress = progress
            return session.run()


def _profile_facts(profile: str, sets: list[str]) -> tuple[dict[str, list[str]], int | None]:
    """Each group's kv_connectors (what a scenario's `without` detaches from) and the smallest
    max_model_len of the engines (what a benchmark prompt must fit)."""
    from kvpd.plan.scenario_check import group_connectors
    from kvpd.profile.load import load_profile

    p, _ = load_profile(profile, sets=list(sets))
    lens: list[int] = []
    for role in ENGINE_ROLES:
        group = p.group(role)
        if group is not None:
            n = group.max_model_len or p.engine.max_model_len or p.model.max_model_len
            if n:
                lens.append(n)
    return group_connectors(p), min(lens) if lens else None


def _route_to_proxy(plan: Plan) -> bool:
    """Whether a client on this machine could reach the serving URL at all: never when kvpd
    itself reaches the proxy's host through a jump host, from the profile or from
    ~/.ssh/config's ProxyJump (no socket is tried then), else whether a TCP connection gets
    an answer."""
    from kvpd.exec.http_wire import endpoint, route_here

    if not plan.proxy_url:
        return True
    if plan.proxy_host and _jumped(plan.host(plan.proxy_host)):
        return False
    ep = endpoint(plan.proxy_url)
    return route_here(ep.address, ep.port)


def _jumped(host: HostSpec) -> bool:
    """Whether kvpd's SSH route to `host` goes through a jump host, resolved over
    ~/.ssh/config as the transport resolves it (an unreadable config counts as a jump: then
    no socket to the cluster is tried either)."""
    if host.jump:
        return True
    if host.transport != "ssh":
        return False
    from kvpd.exec.ssh.config import load_ssh_config, route

    try:
        return bool(route(host, load_ssh_config()).jumps)
    except KvpdError:
        return True


def _client(plan: Plan, tokenizer: str | None) -> tuple[str, str | None]:
    """(the `vllm` command, the host the client runs on or None for this machine).

    `bench.host` decides; unset, this machine when it has `vllm`, the tokenizer and a route
    to the proxy, else the proxy's host (which has all, like every cluster node the guides
    bench from)."""
    from kvpd.bench import runner
    from kvpd.bench.remote import default_host
    from kvpd.plan.rules.bench import LOCAL

    host = plan.bench.host
    remote_vllm = next(
        (p.command[0] for p in plan.processes if p.role in ENGINE_ROLES),
        "vllm",
    )
    if host == LOCAL:
        return runner.find_vllm(), None
    if host is not None:
        return remote_vllm, host
    tok = tokenizer or plan.tokenizer
    try:
        vllm = runner.find_vllm()
    except runner.ClientNotInstalled:
        vllm = ""
    has_tok = not tok.startswith("/") or Path(tok).exists()  # a hub name or a folder here
    chosen = default_host(plan, bool(vllm) and has_tok and _route_to_proxy(plan))
    if chosen is None:
        return vllm or runner.find_vllm(), None
    return remote_vllm, chosen
