"""The guide-shaped results table, the proof table, and PNG charts of a bench run."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table

from kvpd.bench.results import value
from kvpd.bench.saved import BenchRun, Record

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


def results_table(run: BenchRun, stat: str = "mean") -> Table:
    """Rows: input/output length (and concurrency when swept); per scenario column group:
    TTFT, TPOT, E2EL (ms, `stat`), output throughput, and the TTFT/E2EL speedup against the
    first group. A failed record shows its numbers struck through in red: not a result."""
    cols = columns(run)
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
        t.add_column(f"{name}\ntok/s", justify="right")
        if i > 0:
            t.add_column(f"{name}\nspeedup", justify="right")
    for row in rows(run):
        cells = [str(row[0]), str(row[1])]
        if swept_c:
            cells.append("-" if row[2] is None else str(row[2]))
        first = _find(run, cols[0], row) if cols else None
        for i, col in enumerate(cols):
            r = _find(run, col, row)
            vals = [value(r.result, k, stat) if r else None for k, _ in TABLE_METRICS]
            thr = r.result.get("output_throughput") if r else None
            group = [_fmt(v) for v in vals] + [_fmt(thr)]
            if i > 0:
                group.append(speedup(first, r, stat))
            if r is not None and not int(r.result.get("completed") or 0):
                group = ["[red]failed[/]"] + ["-"] * (len(group) - 1)
            elif r is not None and not r.ok:
                group = [f"[red strike]{c}[/]" for c in group]
            cells += group
        t.add_row(*cells)
    return t


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


def proof_table(run: BenchRun) -> Table:
    """Per phase: who served the requests, KV received by decode, cache hits, verdict."""
    t = Table(title="Proof from /metrics (deltas over each phase)")
    for name in ("scenario", "phase", "point", "P reqs", "D reqs", "D KV in", "D cached",
                 "D computed", "proxy P→D", "HBM hits", "ext. hits", "verdict"):  # fmt: skip
        t.add_column(name, justify="left" if name in ("scenario", "phase", "verdict") else "right")
    for r in run.records:
        s = r.metrics.get("summary", {})
        point = f"{r.input_len}/{r.output_len}" + (
            "" if r.max_concurrency is None else f" c{r.max_concurrency}"
        )

        def n(key: str, s: dict = s) -> str:
            v = s.get(key)
            return "-" if v is None else f"{v:,.0f}"

        verdict = "[green]ok[/]" if r.ok else "[red]FAILED[/]"
        if not r.measured and r.ok:
            verdict = "[dim]seeding[/]"
        reqs_p = n("prefill_requests") if "prefill_requests" in s else n("mixed_requests")
        t.add_row(
            r.scenario, r.phase, point, reqs_p, n("decode_requests"),
            n("decode_kv_received_tokens"), n("decode_cached_tokens"), n("decode_computed_tokens"),
            n("proxy_handoffs"), n("prefix_cache_hits"),
            n("external_prefix_cache_hits"), verdict,
        )  # fmt: skip
    return t


def charts(run: BenchRun, out_dir: Path) -> list[Path]:
    """ttft.png and tpot.png: mean latency per scenario over input length (one line per
    scenario/phase and concurrency). Skipped (empty list) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    written = []
    cols = columns(run)
    multi_phase = len({c[1] for c in cols}) > 1
    concs = sorted({r[2] for r in rows(run)}, key=lambda c: -1 if c is None else c)
    for metric, label in (("ttft", "TTFT"), ("tpot", "TPOT")):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for col in cols:
            for c in concs:
                pts = sorted(
                    (r.input_len, value(r.result, metric))
                    for r in run.measured
                    if (r.scenario, r.phase) == col and r.max_concurrency == c and r.ok
                )
                pts = [(x, y) for x, y in pts if y is not None]
                if not pts:
                    continue
                name = _col_title(col, multi_phase) + ("" if len(concs) == 1 else f" c={c}")
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
        ax.set_xlabel("input length (tokens)")
        ax.set_ylabel(f"mean {label} (ms)")
        ax.set_title(f"{run.deployment}: {label} per scenario ({run.protocol})")
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
        path = out_dir / f"{metric}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written
