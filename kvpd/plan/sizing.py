"""KV-cache arithmetic and the size strings the KV stores accept (pure)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from kvpd.plan.value import SparseSizing
from kvpd.profile.schema import ModelSpec

if TYPE_CHECKING:
    from kvpd.native.tune import SparseTuneReport

GiB = 1 << 30
MiB = 1 << 20
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "auto": 2}

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": MiB, "g": GiB, "t": 1 << 40}


def parse_size(text: str | int) -> int:
    """'10GB', '2.5GB', '200MB', '134217728' -> bytes (binary units, as memcache reads them)."""
    if isinstance(text, int):
        return text
    m = _SIZE.match(str(text))
    if not m:
        raise ValueError(f"{text!r} is not a size; write e.g. 10GB, 512MB or a number of bytes")
    value, unit = float(m.group(1)), m.group(2).lower()
    return int(value * _UNITS[unit])


def round_up(n: int, align: int) -> int:
    return -(-n // align) * align


def kv_bytes_per_token(model: ModelSpec) -> int | None:
    """KV-cache bytes one token occupies over all layers (None if the facts are missing).

    MHA/GQA store K and V per KV head; MLA/SFA/DSA store one latent of width
    kv_lora_rank + qk_rope_head_dim (the indexer cache of sparse models is not counted).
    """
    b = DTYPE_BYTES[model.dtype]
    if model.layers is None:
        return None
    if model.attention in ("mla", "sfa", "dsa"):
        if model.kv_lora_rank is None or model.qk_rope_head_dim is None:
            return None
        return model.layers * (model.kv_lora_rank + model.qk_rope_head_dim) * b
    if model.kv_heads is None or model.head_dim is None:
        return None
    return 2 * model.layers * model.kv_heads * model.head_dim * b


def kv_bytes(model: ModelSpec, tokens: int) -> int | None:
    per = kv_bytes_per_token(model)
    return None if per is None else per * tokens


# Assumptions of the quick hot-buffer estimate shown with every plan; `kvpd tune sparse` takes
# them as options (and a recorded trace) for a real sizing.
LINK_GBPS = 25.0
TPOT_MS = 50.0
TRACE_ROWS, TRACE_STEPS = 8, 12


def sparse_estimate(sparse: SparseSizing) -> SparseTuneReport | None:
    """The profile's topk_buffer_size beside the candidate sizes, simulated on a synthetic
    top-k trace (pure, deterministic). None if model facts it needs are missing."""
    from kvpd.native.trace import synthetic_topk_trace
    from kvpd.native.tune import SparseModelFacts, candidate_buffer_sizes, tune_sparse_buffer

    s = sparse
    topk, lora, rope, layers, max_len = (
        s.index_topk, s.kv_lora_rank, s.qk_rope_head_dim, s.layers, s.max_model_len
    )  # fmt: skip
    if topk is None or lora is None or rope is None or layers is None or max_len is None:
        return None
    facts = SparseModelFacts(
        kv_lora_rank=lora,
        qk_rope_head_dim=rope,
        num_layers=layers,
        index_topk=topk,
        block_size=s.block_size,
    )
    trace = synthetic_topk_trace(
        steps=TRACE_STEPS,
        rows=TRACE_ROWS,
        topk=topk,
        max_model_len=max_len,
        seq_len_range=(min(max_len // 2, max_len - TRACE_STEPS - 2), max_len - TRACE_STEPS - 2),
    )
    sizes = sorted(set(candidate_buffer_sizes(topk, s.block_size)) | {s.topk_buffer_size})
    return tune_sparse_buffer(
        trace, facts, bandwidth_gbps=LINK_GBPS, tpot_ms=TPOT_MS, buffer_sizes=sizes, rows=s.rows
    )
