"""What the devices and pools can hold, with the inputs of every formula (pure).

Weights: `model.weights_gb`, which the loader fills from the model dir `model.config` points at
(model.safetensors.index.json's total_size, else the *.safetensors sizes) when the profile does
not state it. Sharded evenly over tp x pp (and over dp with expert parallelism, where experts
spread over every rank of an instance: an optimistic bound, shared and attention weights
replicate). KV: what is left of device memory x gpu_memory_utilization after the weights
(activations and graphs are not counted); MHA/GQA KV heads split over TP ranks, an MLA latent is
whole on every rank; layers split over PP ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvpd.plan.hardware import device_memory_gb
from kvpd.plan.layout import merged
from kvpd.plan.sizing import GiB, kv_bytes, kv_bytes_per_token, round_up
from kvpd.profile.schema import Group, Profile

VLLM_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default --gpu-memory-utilization
VLLM_MAX_NUM_SEQS = 256  # vLLM's default --max-num-seqs of the OpenAI server
# Seconds per GiB of a sparse-offload host pool that `up` allows on top of the engine's own
# start: decode allocates and registers `dram_size_per_dp_gb` per DP rank before it answers
# /health, which on a large pool takes tens of minutes. A generous bound, not a measurement.
POOL_INIT_S_PER_GB = 20.0


@dataclass(frozen=True)
class GroupCapacity:
    """One DP rank (tp x pp devices) of a group, on its first host's devices."""

    role: str
    device_gb: float
    util: float
    weights_gb: float | None
    shards: int  # devices the weights are split over
    token_bytes: int | None  # KV bytes of one token on one device
    max_model_len: int | None
    kv_memory_gb: float | None = None  # kv_cache_memory_bytes: the KV size vLLM is told
    weights_from: str = "model.weights_gb"  # where the weights' size came from

    @property
    def usable_gb(self) -> float:
        return self.device_gb * self.util

    @property
    def weights_per_device_gb(self) -> float | None:
        return None if self.weights_gb is None else self.weights_gb / self.shards

    @property
    def kv_memory_set(self) -> bool:
        return self.kv_memory_gb is not None

    @property
    def kv_gb(self) -> float | None:
        if self.kv_memory_gb is not None:
            return self.kv_memory_gb
        w = self.weights_per_device_gb
        return None if w is None else self.usable_gb - w

    @property
    def tokens(self) -> int | None:
        """Tokens of KV one DP rank holds (None: weights or KV shape unknown)."""
        kv = self.kv_gb
        if kv is None or not self.token_bytes:
            return None
        return max(0, int(kv * GiB) // self.token_bytes)


def group_capacity(profile: Profile, role: str, group: Group) -> GroupCapacity | None:
    """None where the device memory is unknown (cpu/cuda without device_memory_gb)."""
    host = profile.hosts.get(group.hosts[0])
    if host is None:
        return None
    mem = device_memory_gb(profile, host)
    if mem is None:
        return None
    opts = merged(profile, group)
    m = profile.model
    shards = group.tp * group.pp * (group.dp if opts.enable_expert_parallel else 1)
    per_token = kv_bytes_per_token(m)
    token_bytes = None
    if per_token is not None:
        split = group.pp * (
            1 if m.attention in ("mla", "sfa", "dsa") else min(group.tp, m.kv_heads or 1)
        )
        token_bytes = -(-per_token // split)
    kv_set = opts.kv_cache_memory_bytes
    return GroupCapacity(
        role=role,
        device_gb=mem,
        util=opts.gpu_memory_utilization or VLLM_GPU_MEMORY_UTILIZATION,
        weights_gb=m.weights_gb,
        weights_from="model.weights_gb, stated or read from the safetensors next to model.config"
        if m.config
        else "model.weights_gb",
        shards=shards,
        token_bytes=token_bytes,
        max_model_len=opts.max_model_len or m.max_model_len,
        kv_memory_gb=None if kv_set is None else human_bytes(kv_set) / GiB,
    )


def human_bytes(text: str) -> int:
    """vLLM's human-readable byte count (already checked by the schema): 1k/1m/1g/1t powers of
    10 (decimals allowed), 1K/1M/1G/1T powers of 2, or a plain number."""
    unit = text[-1:]
    scale = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
    scale |= {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
    if unit in scale:
        return int(float(text[:-1]) * scale[unit])
    return int(text)


@dataclass(frozen=True)
class MemcacheSizing:
    """`kv.memcache.dram_size: auto`: seq_len x seqs of KV over the LocalService ranks."""

    seq_len: int
    seq_from: str
    seqs: int
    seqs_from: str
    token_bytes: int
    ranks: int

    @property
    def size(self) -> int:
        total = self.token_bytes * self.seq_len * self.seqs
        return round_up(-(-total // max(1, self.ranks)), GiB)


def memcache_sizing(profile: Profile, ranks: int) -> MemcacheSizing | None:
    """What the memcache users' engines can hold at once: every DP rank of a group with
    ascend_store keeps up to max_num_seqs sequences of max_model_len tokens. The profile's
    sizing_seq_len / sizing_concurrency win. None without the model facts."""
    mc = profile.kv.memcache
    per = kv_bytes_per_token(profile.model)
    if mc is None or per is None:
        return None
    seq, seq_from = mc.sizing_seq_len, "kv.memcache.sizing_seq_len"
    if seq is None:
        seq, seq_from = profile.model.max_model_len, "model.max_model_len"
    if seq is None:
        return None
    if mc.sizing_concurrency is not None:
        seqs, seqs_from = mc.sizing_concurrency, "kv.memcache.sizing_concurrency"
    else:
        seqs, parts = 0, []
        for role in ("prefill", "mixed", "decode"):
            g: Group | None = profile.group(role)
            if g is None or "ascend_store" not in g.kv_connectors:
                continue
            opts = merged(profile, g)
            each = opts.max_num_seqs or VLLM_MAX_NUM_SEQS
            why = "max_num_seqs" if opts.max_num_seqs else "vLLM's default max_num_seqs"
            seqs += g.instances * g.dp * each
            parts.append(f"{role} {g.instances} instance(s) x dp {g.dp} x {why} {each}")
        if not seqs:
            return None
        seqs_from = " + ".join(parts)
    return MemcacheSizing(seq, seq_from, seqs, seqs_from, per, ranks)


def memcache_dram_need(profile: Profile, ranks: int) -> int | None:
    s = memcache_sizing(profile, ranks)
    return None if s is None else s.size


def one_sequence_bytes(profile: Profile, max_len: int) -> int | None:
    return kv_bytes(profile.model, max_len)
