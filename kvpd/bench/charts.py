"""PNG charts of a bench run that say something for any run: latency over input length when
the run swept input lengths, bars per scenario when it did not, and the per-request TTFT
distribution (a CDF from the per-request data `vllm bench serve --save-detailed` saved)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kvpd.bench.records import BenchRun, Record
from kvpd.bench.report import columns, rows
from kvpd.bench.serve_output import value

LATENCIES = (("ttft", "TTFT"), ("tpot", "TPOT"), ("e2el", "E2EL"))


def _label(col: tuple[str, str], multi_phase: bool) -> str:
    return f"{col[0]}/{col[1]}" if multi_phase else col[0]


def request_ttfts(record: Record) -> list[float]:
    """Per-request TTFTs in ms from the record's saved raw result (empty when not saved)."""
    if not record.raw_file:
        return []
    try:
        raw = json.loads(Path(record.raw_file).read_text())
    except (OSError, ValueError):
        return []
    ttfts = raw.get("ttfts") if isinstance(raw, dict) else None
    if not isinstance(ttfts, list):
        return []
    # vLLM records a failed request's TTFT as 0.0; it is not a latency
    return sorted(1000.0 * float(t) for t in ttfts if isinstance(t, (int, float)) and t > 0)


def charts(run: BenchRun, out_dir: Path) -> list[Path]:
    """latency.png (lines over input length, or bars per scenario for a single length) and
    ttft_cdf.png (when per-request data was saved). Skipped (empty list) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    ok = [r for r in run.measured if r.ok]
    if not ok:
        return []
    written: list[Path] = []
    swept = len({r.input_len for r in ok}) > 1
    fig = (_lines if swept else _bars)(plt, run, ok)
    written.append(_save(plt, fig, out_dir / "latency.png"))
    cdf = _cdf(plt, run, ok)
    if cdf is not None:
        written.append(_save(plt, cdf, out_dir / "ttft_cdf.png"))
    return written


def _save(plt: Any, fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _lines(plt: Any, run: BenchRun, ok: list[Record]) -> Any:
    """One panel per latency: the mean over input length, a line per scenario/concurrency."""
    cols = columns(run)
    multi_phase = len({c[1] for c in cols}) > 1
    concs = sorted({r[2] for r in rows(run)}, key=lambda c: -1 if c is None else c)
    fig, axes = plt.subplots(1, len(LATENCIES), figsize=(14, 4.5))
    for ax, (metric, label) in zip(axes, LATENCIES, strict=True):
        for col in cols:
            for c in concs:
                pts = sorted(
                    (r.input_len, value(r.result, metric))
                    for r in ok
                    if (r.scenario, r.phase) == col and r.max_concurrency == c
                )
                pts = [(x, y) for x, y in pts if y is not None]
                if pts:
                    name = _label(col, multi_phase) + ("" if len(concs) == 1 else f" c={c}")
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
        ax.set_xlabel("input length (tokens)")
        ax.set_ylabel(f"mean {label} (ms)")
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
    fig.suptitle(f"{run.deployment}: latency per scenario ({run.protocol} protocol)")
    return fig


def _bars(plt: Any, run: BenchRun, ok: list[Record]) -> Any:
    """One panel per latency: a bar per scenario (and concurrency), mean with a p99 tick."""
    cols = columns(run)
    multi_phase = len({c[1] for c in cols}) > 1
    groups = [(r, _label((r.scenario, r.phase), multi_phase)) for r in ok]
    if len({r.max_concurrency for r, _ in groups}) > 1:
        groups = [(r, f"{name} c={r.max_concurrency}") for r, name in groups]
    first = ok[0]
    fig, axes = plt.subplots(1, len(LATENCIES), figsize=(14, 4.5))
    for ax, (metric, label) in zip(axes, LATENCIES, strict=True):
        names = [name for _, name in groups]
        means = [value(r.result, metric) or 0.0 for r, _ in groups]
        p99 = [value(r.result, metric, "p99") for r, _ in groups]
        bars = ax.bar(names, means, color=[f"C{i}" for i in range(len(names))])
        for x, (m, p) in enumerate(zip(means, p99, strict=True)):
            if p is not None and p > m:
                ax.plot([x, x], [m, p], color="black", linewidth=1)
        ax.bar_label(bars, fmt="%.1f", fontsize="small", label_type="center", color="white")
        ax.set_ylabel(f"{label} (ms): mean, line to p99")
        ax.set_title(label)
        ax.grid(True, axis="y", alpha=0.3)
        ax.tick_params(axis="x", labelrotation=20)
    fig.suptitle(
        f"{run.deployment}: input {first.input_len}, output {first.output_len}, "
        f"{first.num_prompts} prompts ({run.protocol} protocol)"
    )
    return fig


def _cdf(plt: Any, run: BenchRun, ok: list[Record]) -> Any | None:
    """The share of requests with a TTFT up to x, a line per measured record."""
    series = [(r, request_ttfts(r)) for r in ok]
    series = [(r, t) for r, t in series if t]
    if not series:
        return None
    multi_phase = len({r.phase for r, _ in series}) > 1
    multi_point = len({(r.input_len, r.output_len, r.max_concurrency) for r, _ in series}) > 1
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r, ttfts in series:
        name = _label((r.scenario, r.phase), multi_phase)
        if multi_point:
            c = "" if r.max_concurrency is None else f" c={r.max_concurrency}"
            name += f" {r.input_len}/{r.output_len}{c}"
        n = len(ttfts)
        ax.step(ttfts, [(i + 1) / n for i in range(n)], where="post", label=f"{name} (n={n})")
    ax.set_xlabel("TTFT (ms)")
    ax.set_ylabel("share of requests")
    ax.set_ylim(0, 1.02)
    ax.set_title(f"{run.deployment}: per-request TTFT distribution")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    return fig
