"""What the plan derived, as lines with each formula's inputs (pure; `kvpd plan` shows them).

Every size kvpd computes rather than reads appears here with where its inputs came from, so a
newcomer sees the figure before `up` uses it.
"""

from __future__ import annotations

from kvpd.plan.capacity import (
    POOL_INIT_S_PER_GB,
    GroupCapacity,
    group_capacity,
    memcache_sizing,
)
from kvpd.plan.hardware import describe
from kvpd.plan.layout import Layout, merged
from kvpd.plan.sizing import GiB, kv_bytes, kv_bytes_per_token
from kvpd.profile.roles import ENGINE_ROLES
from kvpd.profile.schema import Profile


def derived_lines(
    profile: Profile, layout: Layout, memcache_ranks: int, dram: str | None
) -> tuple[str, ...]:
    out = [
        f"{ep.name} on {ep.host}: {describe(profile, profile.hosts[ep.host], ep.devices)}"
        for ep in layout.procs
        if ep.devices
    ]
    out += _kv_token(profile)
    for role in ENGINE_ROLES:
        g = profile.group(role)
        cap = None if g is None else group_capacity(profile, role, g)
        if cap is not None:
            out.append(_capacity(role, cap))
    out += _bench(profile)
    out += _memcache(profile, memcache_ranks, dram)
    out += _sparse_pool(profile)
    out += _pool_health_timeouts(profile, layout)
    return tuple(out)


def _pool_health_timeouts(profile: Profile, layout: Layout) -> list[str]:
    """`up` waits longer for engines that fill a sparse-offload host pool before /health."""
    out = []
    for ep in layout.procs:
        g = profile.engine_group(ep.role)
        so = g.sparse_offload
        if so is None or not so.enabled or g.health_timeout_s is not None:
            continue
        base = profile.runtime.health_timeout_s
        ranks = max(1, len(ep.devices) // max(1, g.tp * g.pp))
        total = base + POOL_INIT_S_PER_GB * so.dram_size_per_dp_gb * ranks
        out.append(
            f"{ep.name} health timeout: runtime.health_timeout_s {base:g} + "
            f"{POOL_INIT_S_PER_GB:g} s a GiB x {so.dram_size_per_dp_gb} GB x {ranks} DP rank(s) "
            f"= {total:g} s"
        )
    return out


def _kv_token(profile: Profile) -> list[str]:
    m = profile.model
    per = kv_bytes_per_token(m)
    if per is None:
        return []
    if m.attention in ("mla", "sfa", "dsa"):
        latent = f"kv_lora_rank {m.kv_lora_rank} + qk_rope_head_dim {m.qk_rope_head_dim}"
        shape = f"{m.layers} layers x ({latent})"
    else:
        shape = f"2 x {m.layers} layers x {m.kv_heads} kv_heads x head_dim {m.head_dim}"
    return [f"KV a token: {shape} x {m.dtype} = {per} B"]


def _capacity(role: str, cap: GroupCapacity) -> str:
    head = (
        f"{role} device: {cap.device_gb:g} GB x gpu_memory_utilization {cap.util:g} = "
        f"{cap.usable_gb:.1f} GB"
    )
    if cap.kv_memory_gb is not None and cap.tokens is not None:
        head += (
            f"; KV kv_cache_memory_bytes {cap.kv_memory_gb:.1f} GB / {cap.token_bytes} B a "
            f"token = {cap.tokens} tokens a DP rank"
        )
    if cap.weights_gb is None:
        return (
            f"{head}; weights unknown, so weights + KV are not checked (state model.weights_gb, "
            "or point model.config at the model dir with its safetensors)"
        )
    text = (
        f"{head}; weights {cap.weights_gb:g} GB ({cap.weights_from}) / {cap.shards} devices = "
        f"{cap.weights_per_device_gb:.1f} GB"
    )
    if cap.kv_memory_set:
        return text
    if cap.kv_gb is not None and cap.tokens is not None:
        text += (
            f"; KV {cap.kv_gb:.1f} GB / {cap.token_bytes} B a token = {cap.tokens} tokens a DP rank"
        )
    return text


def _bench(profile: Profile) -> list[str]:
    g = profile.prefill or profile.mixed
    role = "prefill" if profile.prefill else "mixed"
    if g is None:
        return []
    cap = group_capacity(profile, role, g)
    tokens = None if cap is None else cap.tokens
    b = profile.bench
    if tokens is None:
        return []
    ranks = g.instances * g.dp
    fit = ranks * (tokens // b.input_len)
    held = "all of them" if fit >= b.num_prompts else f"only {fit} of them"
    return [
        f"bench: {b.num_prompts} prompts of {b.input_len} tokens; the {role} HBM KV cache holds "
        f"{held} (room for {ranks} DP rank(s) x {tokens} tokens // {b.input_len} = {fit})"
    ]


def _memcache(profile: Profile, ranks: int, dram: str | None) -> list[str]:
    mc = profile.kv.memcache
    if mc is None:
        return []
    s = memcache_sizing(profile, ranks)
    if s is None:
        return [f"kv.memcache.dram_size: {dram or mc.dram_size} (no model facts to size it)"]
    formula = (
        f"{s.token_bytes} B a token x {s.seq_len} tokens ({s.seq_from}) x {s.seqs} sequences "
        f"({s.seqs_from}) / {s.ranks} LocalService ranks, rounded up to GiB = {s.size // GiB}GB"
    )
    if mc.dram_size == "auto":
        return [f"kv.memcache.dram_size auto: {formula}"]
    return [f"kv.memcache.dram_size {dram} as the profile says (sizing: {formula})"]


def _sparse_pool(profile: Profile) -> list[str]:
    d = profile.decode
    if d is None or d.sparse_offload is None or not d.sparse_offload.enabled:
        return []
    max_len = merged(profile, d).max_model_len or profile.model.max_model_len
    one = kv_bytes(profile.model, max_len) if max_len else None
    pool = d.sparse_offload.dram_size_per_dp_gb
    if one is None:
        return [f"decode host pool: {pool} GB a DP rank"]
    return [
        f"decode host pool: {pool} GB a DP rank holds {pool * GiB // one} sequences of "
        f"{max_len} tokens ({one / GiB:.2f} GiB each)"
    ]
