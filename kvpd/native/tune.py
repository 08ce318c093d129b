"""Sizing the sparse-KV hot buffer (topk_buffer_size): simulate the planner over a top-k trace.

Pure: takes a trace and model facts, returns a report. For each candidate buffer size it runs
the LRU planner over the trace (one representative layer, scaled to all offloaded layers) and
turns the misses into host->device bytes per decode step and copy time at the link bandwidth,
then recommends the smallest size whose copy time fits the share of the TPOT budget.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvpd.native.trace import TopkTrace

DEFAULT_FACTORS = (1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0)


@dataclass(frozen=True)
class SparseModelFacts:
    """Model and link facts that turn misses into bytes and time (MLA, BF16 by default)."""

    kv_lora_rank: int = 512
    qk_rope_head_dim: int = 64
    num_layers: int = 61  # layers whose KV is offloaded and planned every step
    index_topk: int = 2048
    block_size: int = 128
    dtype_bytes: int = 2

    @property
    def token_bytes_k(self) -> int:
        return self.kv_lora_rank * self.dtype_bytes

    @property
    def token_bytes_v(self) -> int:
        return self.qk_rope_head_dim * self.dtype_bytes

    @property
    def token_bytes(self) -> int:
        return self.token_bytes_k + self.token_bytes_v


@dataclass(frozen=True)
class BufferSizeResult:
    buffer_size: int
    hit_rate: float  # resident share of valid top-k tokens, after warm-up
    misses_per_row: float  # per layer and decode row, mean over steps
    bytes_per_step: float  # host->device, all rows and layers, one decode step
    copy_ms: float  # bytes_per_step at the link bandwidth
    device_bytes: int  # hot buffer on the device: rows x buffer_size x token bytes x layers
    fits: bool


@dataclass(frozen=True)
class SparseTuneReport:
    results: tuple[BufferSizeResult, ...]
    recommended: int | None  # smallest fitting buffer_size, None if none fits
    budget_ms: float  # copy_share x tpot_ms
    rows: int
    bandwidth_gbps: float
    tpot_ms: float
    implementation: str


def candidate_buffer_sizes(index_topk: int, block_size: int) -> list[int]:
    """Multiples of block_size from index_topk up to 4x (vLLM-Ascend requires both rules)."""
    sizes = {-(-int(index_topk * f) // block_size) * block_size for f in DEFAULT_FACTORS}
    return sorted(sizes)


def tune_sparse_buffer(
    trace: TopkTrace,
    facts: SparseModelFacts,
    *,
    bandwidth_gbps: float,
    tpot_ms: float,
    copy_share: float = 0.25,
    buffer_sizes: Sequence[int] | None = None,
    rows: int | None = None,
    warmup_steps: int = 1,
) -> SparseTuneReport:
    """Simulate the planner for each buffer size and recommend the smallest that fits.

    Args:
        trace: one layer's top-k trace; its top-k width must equal facts.index_topk.
        facts: model facts (token bytes, offloaded layers, top-k, block size).
        bandwidth_gbps: host->device link bandwidth in GB/s (1e9 bytes/s) for these copies.
        tpot_ms: time-per-output-token budget of a decode step.
        copy_share: share of tpot_ms the per-step copies may take.
        buffer_sizes: candidates (default: candidate_buffer_sizes()).
        rows: decode rows per step to scale to (default: the trace's rows).
        warmup_steps: first steps left out of the statistics (cold buffer).

    Returns:
        SparseTuneReport, results in increasing buffer size.
    """
    from kvpd.native import IMPLEMENTATION, SparseLRUPlanner

    if trace.topk != facts.index_topk:
        raise ValueError(f"the trace's top-k width {trace.topk} != index_topk {facts.index_topk}")
    if bandwidth_gbps <= 0 or tpot_ms <= 0 or not 0 < copy_share <= 1:
        raise ValueError("bandwidth_gbps and tpot_ms must be > 0 and copy_share in (0, 1]")
    sizes = sorted(set(buffer_sizes or candidate_buffer_sizes(facts.index_topk, facts.block_size)))
    warm = min(warmup_steps, trace.steps - 1)
    rows_out = rows or trace.rows
    budget_ms = copy_share * tpot_ms
    valid = (trace.topk_indices >= 0) & (trace.topk_indices < trace.max_model_len)
    wanted = sum(
        len(np.unique(trace.topk_indices[s, r][valid[s, r]]))
        for s in range(warm, trace.steps)
        for r in range(trace.rows)
    )
    results = []
    for size in sizes:
        planner = SparseLRUPlanner(1, trace.rows, trace.topk, size, trace.max_model_len)
        misses = 0
        for s in range(trace.steps):
            count = planner.plan(
                0, trace.topk_indices[s], trace.req_ids[s], trace.stable_prefix_lens[s]
            )[3]
            if s >= warm:
                misses += int(count.sum())
        per_row = misses / max(1, (trace.steps - warm) * trace.rows)
        bytes_step = per_row * rows_out * facts.num_layers * facts.token_bytes
        copy_ms = bytes_step / (bandwidth_gbps * 1e9) * 1e3
        results.append(
            BufferSizeResult(
                buffer_size=size,
                hit_rate=1.0 - misses / wanted if wanted else 1.0,
                misses_per_row=per_row,
                bytes_per_step=bytes_step,
                copy_ms=copy_ms,
                device_bytes=rows_out * size * facts.token_bytes * facts.num_layers,
                fits=copy_ms <= budget_ms,
            )
        )
    fitting = [r.buffer_size for r in results if r.fits]
    return SparseTuneReport(
        results=tuple(results),
        recommended=fitting[0] if fitting else None,
        budget_ms=budget_ms,
        rows=rows_out,
        bandwidth_gbps=bandwidth_gbps,
        tpot_ms=tpot_ms,
        implementation=IMPLEMENTATION,
    )
