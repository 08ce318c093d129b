"""KV-cache arithmetic and the size strings the KV stores accept (pure)."""

from __future__ import annotations

import re

from kvpd.profile.schema import ModelSpec, Profile

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


def memcache_dram_need(profile: Profile, ranks: int) -> int | None:
    """The guide's memcache dram.size: the KV cache of the target sequence length x concurrency,
    divided over the LocalService ranks, rounded up to whole GiB (None without model facts)."""
    mc = profile.kv.memcache
    if mc is None:
        return None
    seq = mc.sizing_seq_len or profile.model.max_model_len
    conc = mc.sizing_concurrency or profile.bench.max_concurrency or profile.bench.num_prompts
    total = kv_bytes(profile.model, seq) if seq else None
    if total is None:
        return None
    return round_up(-(-(total * conc) // max(1, ranks)), GiB)
