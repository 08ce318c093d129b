"""The guide-shaped results table, the proof table, and PNG charts of a bench run."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from kvpd.bench.records import BenchRun, Record
from kvpd.bench.serve_output import value

TABLE_METRICS = (("ttft", "TTFT"), ("tpot", "TPOT"), ("e2el", "E2EL"))
STATS = ("mean", "median", "p99")


def _fmt(v: float | None, digits: int = 1) -> str:
    return "-" if v is None else f"{v:,.{digits}f}"


def columns(run: BenchRun) -> list[tuple[str, str]]:
    """(scenario, phase) column groups in run order, measured phases only."""
    out: list[tuple[str, str]] = []
    for r in run.measured:
        if (r.scenario, r.phase) not in out:
            out.append((r.scenario, r.phase))
    return out


def rows(run: BenchRun) -> list[tuple[int, int, int | None]]:
    out: list[tuple[int, int, int | None]] = []
    for r in run.measured:
        k = (r.input_len, r.output_len, r.max_concurrency)
        if k not in out:
            out.append(k)
    return out


def _find(run: BenchRun, col: tuple[str, str], row: tuple[int, int, int | None]) -> Record | None:
    for r in run.measured:
        if (r.scenario, r.phase) == col and (r.input_len, r.output_len, r.max_concurrency) == row:
            return r
    return None


def _col_title(col: tuple[str, str], multi_phase: bool) -> str:
    scenario, phase = col
    return f"{scenario}/{phase}" if multi_phase else scenario


def baseline_column(run: BenchRun, cols: list[tuple[str, str]]) -> int:
    """The column speedups are against: the recompute scenario (cache: none), else the first."""
    none = {s["name"] for s in run.scenarios if s.get("cache") == "none"}
    return next((i for i, c in enumerate(cols) if c[0] in none), 0)


def results_table(run: BenchRun, stat: str = "mean") -> Table:
    """The guide's table: rows input/output length (and concurrency when swept); per scenario
    column group TTFT, TPOT, E2EL (ms, `stat`) and the TTFT/E2EL speedup against recompute
    (the scenario with cache: none, else the first group). A failed record shows its numbers
    struck through in red: not a result."""
    cols = columns(run)
    base = baseline_column(run, cols)
    multi_phase = len({c[1] for c in cols}) > 1
    swept_c = len({r[2] for r in rows(run)}) > 1
    t = Table(title=f"{run.deployment}: {run.protocol} protocol, {stat} latency (ms)")
    t.add_column("input", justify="right")
    t.add_column("output", justify="right")
    if swept_c:
        t.add_column("conc.", justify="right")
    for i, col in enumerate(cols):
        name = _col_title(col, multi_phase)
        for _, label in TABLE_METRICS:
            t.add_column(f"{name}\n{label}", justify="right")
        if i != base:
            t.add_column(f"{name}\nspeedup", justify="right")
    for row in rows(run):
        cells = [str(row[0]), str(row[1])]
        if swept_c:
            cells.append("-" if row[2] is None else str(row[2]))
        first = _find(run, cols[base], row) if cols else None
        for i, col in enumerate(cols):
            cells += _group_cells(_find(run, col, row), first, stat, speedup_col=i != base)
        t.add_row(*cells)
    return t


def _group_cells(
    r: Record | None, first: Record | None, stat: str, *, speedup_col: bool
) -> list[str]:
    """One scenario's cells of a row: the metrics, the speedup against `first` (not in the
    baseline's own column), and a failed record marked as no result."""
    vals = [value(r.result, k, stat) if r else None for k, _ in TABLE_METRICS]
    group = [_fmt(v) for v in vals]
    if speedup_col:
        group.append(speedup(first, r, stat))
    if r is not None and not int(r.result.get("completed") or 0):
        group = ["[red]failed[/]"] + ["-"] * (len(group) - 1)
    elif r is not None and not r.ok:
        group = [f"[red strike]{c}[/]" for c in group]
    return group


def latency_table(record: Record) -> Table:
    """One measured phase in detail: TTFT, TPOT, ITL and E2EL with mean, median and p99, plus
    throughput (what `vllm bench serve` prints, as one table)."""
    r = record.result
    t = Table(
        title=f"{record.scenario} / {record.phase}: input {record.input_len}, output "
        f"{record.output_len}, {record.num_prompts} prompts"
        + (f", concurrency {record.max_concurrency}" if record.max_concurrency else "")
    )
    t.add_column("ms", justify="left")
    for s in STATS:
        t.add_column(s, justify="right")
    for key, name in (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2el", "E2EL")):
        t.add_row(name, *(_fmt(value(r, key, s)) for s in STATS))
    done, failed = r.get("completed"), r.get("failed")
    t.caption = (
        f"{done} ok, {failed} failed; "
        f"{_fmt(r.get('request_throughput'), 2)} req/s, "
        f"{_fmt(r.get('output_throughput'))} output tok/s, "
        f"{_fmt(r.get('total_token_throughput'))} total tok/s"
    )
    if record.outputs:
        t.caption += f"; {record.outputs.get('summary', '')}"
    return t


def speedup(base: Record | None, other: Record | None, stat: str = "mean") -> str:
    """TTFT and E2EL of the first scenario divided by this one's (>1: faster)."""
    if base is None or other is None:
        return "-"
    parts = []
    for metric in ("ttft", "e2el"):
        a, b = value(base.result, metric, stat), value(other.result, metric, stat)
        parts.append(f"{a / b:.2f}x" if a and b else "-")
    return " / ".join(parts)


def ratio(v: float | None) -> str:
    """The prefilling engines' prefix-cache hit ratio of a phase (0.800: the guide's ideal
    for its seed-80%-then-full protocol)."""
    return "-" if v is None else f"{v:.3f}"


def proof_table(run: BenchRun) -> Table:
    """Per phase: who served the requests, KV received by decode, cache hits, verdict."""
    t = Table(title="Proof from /metrics (deltas over each phase)")
    for name in ("scenario", "phase", "point", "P reqs", "D reqs", "D KV in", "D cached",
                 "D computed", "proxy P→D", "HBM hits", "hit ratio", "ext. hits", "outputs",
                 "verdict"):  # fmt: skip
        t.add_column(name, justify="left" if name in ("scenario", "phase", "verdict") else "right")
    for r in run.records:
        s = r.metrics.get("summary", {})
        point = f"{r.input_len}/{r.output_len}" + (
            "" if r.max_concurrency is None else f" c{r.max_concurrency}"
        )

        def n(key: str, s: dict[str, Any] = s) -> str:
            v = s.get(key)
            return "-" if v is None else f"{v:,.0f}"

        verdict = "[green]ok[/]" if r.ok else "[red]FAILED[/]"
        if not r.measured and r.ok:
            verdict = "[dim]seeding[/]"
        reqs_p = n("prefill_requests") if "prefill_requests" in s else n("mixed_requests")
        t.add_row(
            r.scenario, r.phase, point, reqs_p, n("decode_requests"),
            n("decode_kv_received_tokens"), n("decode_cached_tokens"), n("decode_computed_tokens"),
            n("proxy_handoffs"), n("prefix_cache_hits"), ratio(s.get("prefix_hit_ratio")),
            n("external_prefix_cache_hits"), outputs_cell(r), verdict,
        )  # fmt: skip
    return t


def outputs_cell(r: Record) -> str:
    """`4/4 identical`, `3/4 FAILED` or `-` (not checked)."""
    o = r.outputs
    if not o:
        return "-"
    prompts = o.get("prompts") or []
    passed = sum(1 for p in prompts if p.get("ok"))
    total = len(prompts) + len(o.get("errors") or [])
    if not o.get("ok"):
        return f"[red]{passed}/{total} FAILED[/]"
    how = "identical" if o.get("mode") == "identical" else f"±{o.get('tolerance')}"
    return f"{passed}/{total} {how}"


def outputs_lines(run: BenchRun) -> list[str]:
    """One line per phase with an output check: `scenario/phase point: outputs: 4/4 identical
    (first 16 tokens)` (its summary, as results.json has it)."""
    return [f"{r.label}: {r.outputs.get('summary', '')}" for r in run.records if r.outputs]
