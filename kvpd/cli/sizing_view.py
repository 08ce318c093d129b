"""The sizing section `kvpd plan` prints: the sparse-offload hot buffer, simulated."""

from __future__ import annotations

from typing import Any

# Assumptions of the quick estimate shown with every plan; `kvpd tune sparse` takes them as
# options (and a recorded trace) for a real sizing.
LINK_GBPS = 25.0
TPOT_MS = 50.0
ROWS, STEPS = 8, 12


def sparse_sizing_lines(sparse: dict[str, Any]) -> list[str]:
    """A few lines comparing the profile's topk_buffer_size with candidates (synthetic trace)."""
    from kvpd.native.trace import synthetic_topk_trace
    from kvpd.native.tune import SparseModelFacts, candidate_buffer_sizes, tune_sparse_buffer

    need = ("index_topk", "kv_lora_rank", "qk_rope_head_dim", "layers", "max_model_len")
    if any(sparse.get(k) is None for k in need):
        return ["sparse offload sizing: model facts missing (index_topk, kv_lora_rank, ...)"]
    topk, block = sparse["index_topk"], sparse["block_size"]
    facts = SparseModelFacts(
        kv_lora_rank=sparse["kv_lora_rank"],
        qk_rope_head_dim=sparse["qk_rope_head_dim"],
        num_layers=sparse["layers"],
        index_topk=topk,
        block_size=block,
    )
    max_len = sparse["max_model_len"]
    trace = synthetic_topk_trace(
        steps=STEPS,
        rows=ROWS,
        topk=topk,
        max_model_len=max_len,
        seq_len_range=(min(max_len // 2, max_len - STEPS - 2), max_len - STEPS - 2),
    )
    sizes = sorted(set(candidate_buffer_sizes(topk, block)) | {sparse["topk_buffer_size"]})
    rep = tune_sparse_buffer(
        trace,
        facts,
        bandwidth_gbps=LINK_GBPS,
        tpot_ms=TPOT_MS,
        buffer_sizes=sizes,
        rows=sparse["rows"],
    )
    lines = [
        f"sparse offload sizing (synthetic trace, {sparse['rows']} rows, {LINK_GBPS:g} GB/s, "
        f"copy budget {rep.budget_ms:.1f} ms of TPOT {TPOT_MS:g} ms; `kvpd tune sparse` "
        "for your own trace):"
    ]
    for r in rep.results:
        mark = " <- profile" if r.buffer_size == sparse["topk_buffer_size"] else ""
        lines.append(
            f"  topk_buffer_size {r.buffer_size:>6}: hit {r.hit_rate:6.1%}, "
            f"{r.bytes_per_step / 1e6:8.1f} MB/step, copy {r.copy_ms:6.2f} ms, "
            f"{'fits' if r.fits else 'too slow'}{mark}"
        )
    if rep.recommended is not None:
        lines.append(f"  recommended: {rep.recommended}")
    return lines
