"""`kvpd tune sparse`: size the sparse-KV hot buffer (topk_buffer_size) from a top-k trace."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from kvpd.native.tune import SparseModelFacts, SparseTuneReport


def _parse_sizes(text: str) -> list[int]:
    try:
        sizes = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise typer.BadParameter(f"expected comma-separated integers, got {text!r}") from None
    if not sizes or min(sizes) <= 0:
        raise typer.BadParameter("buffer sizes must be positive integers")
    return sizes


def sparse(
    trace_path: Path | None = typer.Option(
        None,
        "--trace",
        exists=True,
        dir_okay=False,
        help=".npz with topk_indices [steps, rows, topk] (optional req_ids, "
        "stable_prefix_lens). Default: a synthetic step-to-step overlap model.",
    ),
    kv_lora_rank: int = typer.Option(512, min=1, help="MLA kv_lora_rank (K bytes = x2)."),
    qk_rope_head_dim: int = typer.Option(64, min=1, help="MLA qk_rope_head_dim (V = x2)."),
    layers: int = typer.Option(61, min=1, help="Offloaded layers planned every step."),
    index_topk: int = typer.Option(2048, min=1, help="Indexer top-k per row."),
    block_size: int = typer.Option(128, min=1, help="KV cache block size."),
    bandwidth_gbps: float = typer.Option(
        ..., min=0.001, help="Host->device bandwidth for the copies, GB/s."
    ),
    tpot_ms: float = typer.Option(..., min=0.001, help="TPOT budget of a decode step, ms."),
    copy_share: float = typer.Option(
        0.25, min=0.01, max=1.0, help="Share of the TPOT the per-step copies may take."
    ),
    batch_rows: int = typer.Option(
        64, min=1, help="Decode rows per step to scale the bytes to (max_num_seqs x (1+MTP))."
    ),
    buffer_sizes: str = typer.Option(
        "", help="Comma-separated topk_buffer_size candidates (default: 1x..4x index_topk)."
    ),
    rows: int = typer.Option(8, min=1, help="Synthetic: rows simulated."),
    steps: int = typer.Option(24, min=2, help="Synthetic: decode steps simulated."),
    overlap: float = typer.Option(
        0.8, min=0.0, max=1.0, help="Synthetic: share of top-k kept from the previous step."
    ),
    revisit: float = typer.Option(
        0.5,
        min=0.0,
        max=1.0,
        help="Synthetic: share of replacements that return from recently dropped tokens.",
    ),
    seq_len_min: int = typer.Option(20_000, min=1, help="Synthetic: shortest sequence."),
    seq_len_max: int = typer.Option(131_072, min=1, help="Synthetic: longest sequence."),
    max_model_len: int = typer.Option(131_072, min=1, help="Model max length."),
    seed: int = typer.Option(0, help="Synthetic: random seed."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Simulate the hot buffer for several topk_buffer_size values; recommend the smallest
    whose host->device copies fit the TPOT budget."""
    from kvpd.native.trace import load_topk_trace, synthetic_topk_trace
    from kvpd.native.tune import SparseModelFacts, tune_sparse_buffer

    facts = SparseModelFacts(
        kv_lora_rank=kv_lora_rank,
        qk_rope_head_dim=qk_rope_head_dim,
        num_layers=layers,
        index_topk=index_topk,
        block_size=block_size,
    )
    sizes = _parse_sizes(buffer_sizes) if buffer_sizes else None
    if sizes and min(sizes) < index_topk:
        raise typer.BadParameter(
            f"every buffer size must be >= index_topk ({index_topk}), got {min(sizes)}",
            param_hint="--buffer-sizes",
        )
    if trace_path is not None:
        trace = load_topk_trace(trace_path, max_model_len=max_model_len)
        if trace.topk != index_topk:
            raise typer.BadParameter(
                f"the trace has top-k width {trace.topk}; pass --index-topk {trace.topk}",
                param_hint="--index-topk",
            )
        source = str(trace_path)
    else:
        if seq_len_min > seq_len_max or seq_len_max > max_model_len:
            raise typer.BadParameter(
                "need seq_len_min <= seq_len_max <= max_model_len", param_hint="--seq-len-max"
            )
        trace = synthetic_topk_trace(
            steps=steps,
            rows=rows,
            topk=index_topk,
            max_model_len=max_model_len,
            seq_len_range=(seq_len_min, seq_len_max),
            overlap=overlap,
            revisit=revisit,
            seed=seed,
        )
        source = f"synthetic (overlap {overlap:g}, revisit {revisit:g}, seed {seed})"
    report = tune_sparse_buffer(
        trace,
        facts,
        bandwidth_gbps=bandwidth_gbps,
        tpot_ms=tpot_ms,
        copy_share=copy_share,
        buffer_sizes=sizes,
        rows=batch_rows,
    )
    if as_json:
        data = asdict(report)
        data["trace"] = source
        print(json.dumps(data, indent=2))
        return
    _print_report(report, source, facts)


def register(app: typer.Typer) -> None:
    tune = typer.Typer(help="Size offload buffers by simulation.")
    app.add_typer(tune, name="tune")

    tune.command("sparse")(sparse)


def _print_report(report: SparseTuneReport, source: str, facts: SparseModelFacts) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False)
    console.print(
        f"{report.rows} rows x {facts.num_layers} layers at {report.bandwidth_gbps:g} GB/s; "
        f"copy budget {report.budget_ms:.2f} ms of TPOT {report.tpot_ms:g} ms"
    )
    table = Table()
    for col in ("buffer", "hit", "miss/row", "MiB/step", "copy ms", "HBM GiB", "fit"):
        table.add_column(col, justify="right")
    for r in report.results:
        mark = "best" if r.buffer_size == report.recommended else ("yes" if r.fits else "no")
        table.add_row(
            str(r.buffer_size),
            f"{r.hit_rate:.1%}",
            f"{r.misses_per_row:.0f}",
            f"{r.bytes_per_step / 2**20:,.0f}",
            f"{r.copy_ms:.2f}",
            f"{r.device_bytes / 2**30:,.1f}",
            mark,
        )
    console.print(table)
    console.print(
        f"trace: {source}; planner: {report.implementation}; token bytes "
        f"K {facts.token_bytes_k} + V {facts.token_bytes_v}"
    )
    if report.recommended is not None:
        console.print(f"recommended topk_buffer_size: {report.recommended}")
    else:
        best = min(report.results, key=lambda r: r.copy_ms)
        console.print(
            f"no candidate fits: the best ({best.buffer_size}) needs {best.copy_ms:.2f} ms of "
            f"copies per step against {report.budget_ms:.2f} ms. Raise --tpot-ms or "
            "--copy-share, use fewer --batch-rows, or try larger --buffer-sizes."
        )
