"""Rules about the sparse-offload planner (pure): vLLM-Ascend's 32-bit address limit, and the
kvpd plugin reaching the decode processes.
"""

from __future__ import annotations

from kvpd.plan.layout import merged
from kvpd.plan.rules.base import Checker
from kvpd.plan.sizing import GiB
from kvpd.plan.sparse_planner import ENV, PLUGIN, sparse_planner
from kvpd.profile.schema import Group, Profile

HOST_BYTES = 2  # vLLM-Ascend's host pool holds K and V in BF16 whatever the model dtype
INT32_MAX = 2**31 - 1


def rule_planner(c: Checker) -> None:
    """Every planner problem of the profile's decode group, each naming its field."""
    g = c.p.decode
    planner = sparse_planner(g)
    if g is None or planner is None:
        return
    for path, msg in _env_problems(c.p, g, planner):
        c.err(path, msg)
    if planner == "upstream":
        limit = upstream_block_limit(c.p, g)
        if limit:
            c.err(("decode", "sparse_offload", "dram_size_per_dp_gb"), limit)


def upstream_block_limit(profile: Profile, g: Group) -> str | None:
    """Why the host pool is too large for vLLM-Ascend's planner, or None when it fits.

    The planner computes a host address as `block_id * block_size * token_bytes_k` in int32
    (`sparse_kv_offload.cpp`), so it wraps once a block id reaches 2^31 / (block_size *
    kv_lora_rank * 2): 16384 at block 128 and kv_lora_rank 512.
    """
    m = profile.model
    so = g.sparse_offload
    if so is None or m.layers is None or m.kv_lora_rank is None or m.qk_rope_head_dim is None:
        return None  # the model facts rules already ask for these
    block = merged(profile, g).block_size or m.block_size
    tok_k, tok_v = m.kv_lora_rank * HOST_BYTES, m.qk_rope_head_dim * HOST_BYTES
    per_block = m.layers * block * (tok_k + tok_v)
    blocks = so.dram_size_per_dp_gb * GiB // per_block
    safe = INT32_MAX // (block * tok_k)  # the largest block id whose K address does not wrap
    if blocks - 1 <= safe:
        return None
    max_gb = (safe + 1) * per_block // GiB
    return (
        f"a {so.dram_size_per_dp_gb} GiB host pool per DP rank holds {blocks:,} blocks "
        f"({m.layers} layers x block {block} x {tok_k + tok_v} B per token), so block ids "
        f"reach {blocks - 1:,}; vLLM-Ascend's planner (planner: upstream) computes host addresses "
        f"as a 32-bit product block_id x {block * tok_k:,} B, which wraps from block id "
        f"{safe + 1:,}: decode would load K/V from wrong host memory. Use planner: kvpd (kvpd's "
        f"planner computes addresses in 64 bits and has no such limit) or at most {max_gb} GiB."
    )


def _env_problems(profile: Profile, g: Group, planner: str) -> list[tuple[tuple[str, ...], str]]:
    # Where each variable of the decode environment comes from: group, then engine, then profile.
    sources = [
        (("decode", "env"), g.env),
        (("engine", "env"), profile.engine.env),
        (("env",), profile.env),
    ]
    out: list[tuple[tuple[str, ...], str]] = []
    for path, env in sources:
        if env and ENV in env:
            out.append(
                ((*path, ENV), f"kvpd sets {ENV} from decode.sparse_offload.planner; set the "
                 f"planner there (auto | kvpd | upstream) instead of the variable.")
            )  # fmt: skip
    if planner != "kvpd":
        return out
    for path, env in sources:
        if env and "VLLM_PLUGINS" in env:
            value = env["VLLM_PLUGINS"]
            items = value.split(",")  # as vLLM does: no stripping
            if PLUGIN not in items:
                kept = [v.strip() for v in items if v.strip() and v.strip() != PLUGIN]
                spaced = PLUGIN in [v.strip() for v in items]
                out.append(
                    (
                        (*path, "VLLM_PLUGINS"),
                        f"VLLM_PLUGINS={value!r} is vLLM's allow-list of plugins and leaves out "
                        f"{PLUGIN!r}, so decode would run vLLM-Ascend's JIT-built planner "
                        "although decode.sparse_offload.planner is kvpd. "
                        + ("vLLM does not strip spaces around the names. " if spaced else "")
                        + f"Set VLLM_PLUGINS={','.join([*kept, PLUGIN])} or planner: upstream.",
                    )
                )
            break  # the nearest definition is the one the process gets
    return out
