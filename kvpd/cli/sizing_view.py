"""The sizing section `kvpd plan` prints: the plan's sparse-offload hot-buffer estimate."""

from __future__ import annotations

from kvpd.plan.sizing import LINK_GBPS, TPOT_MS, sparse_estimate
from kvpd.plan.value import SparseSizing


def sparse_sizing_lines(sparse: SparseSizing) -> list[str]:
    """A few lines comparing the profile's topk_buffer_size with candidates (synthetic trace)."""
    rep = sparse_estimate(sparse)
    if rep is None:
        return ["sparse offload sizing: model facts missing (index_topk, kv_lora_rank, ...)"]
    lines = [
        f"sparse offload sizing (synthetic trace, {sparse.rows} rows, {LINK_GBPS:g} GB/s, "
        f"copy budget {rep.budget_ms:.1f} ms of TPOT {TPOT_MS:g} ms; `kvpd tune sparse` "
        "for your own trace):"
    ]
    for r in rep.results:
        mark = " <- profile" if r.buffer_size == sparse.topk_buffer_size else ""
        lines.append(
            f"  topk_buffer_size {r.buffer_size:>6}: hit {r.hit_rate:6.1%}, "
            f"{r.bytes_per_step / 1e6:8.1f} MB/step, copy {r.copy_ms:6.2f} ms, "
            f"{'fits' if r.fits else 'too slow'}{mark}"
        )
    if rep.recommended is not None:
        lines.append(f"  recommended: {rep.recommended}")
    return lines
