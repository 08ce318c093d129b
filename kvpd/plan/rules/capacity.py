"""Capacity before load: what the model facts and the device memory allow (kvpd.plan.capacity)."""

from __future__ import annotations

from kvpd.plan.capacity import GroupCapacity, group_capacity
from kvpd.plan.hardware import KINDS
from kvpd.plan.layout import merged
from kvpd.plan.rules.base import Checker
from kvpd.plan.sizing import GiB, kv_bytes
from kvpd.profile.schema import ASCEND


def rule_attention_heads(c: Checker) -> None:
    """vLLM splits the query heads evenly over TP ranks (MLA/SFA too, where there is one
    latent KV head): tp must divide model.heads."""
    heads = c.p.model.heads
    if heads is None:
        return
    for role, g in c.groups():
        if heads % g.tp:
            ok = [t for t in (1, 2, 4, 8, 16, 32, 64) if heads % t == 0 and t <= 2 * g.tp]
            c.err(
                (role, "tp"),
                f"tp {g.tp} does not divide the model's {heads} attention heads (vLLM gives "
                f"every TP rank heads / tp of them). Use tp {' or '.join(map(str, ok[-3:]))}.",
            )


def rule_device_memory(c: Checker) -> None:
    """Weights plus one max_model_len sequence of KV must fit each device of a DP rank."""
    for role, g in c.groups():
        if any(h not in c.p.hosts for h in g.hosts):
            continue
        cap = group_capacity(c.p, role, g)
        if cap is None:
            continue
        if cap.weights_per_device_gb is not None and not _weights_fit(c, role, cap):
            continue
        tokens, max_len = cap.tokens, cap.max_model_len
        if tokens is None or max_len is None or tokens >= max_len:
            continue
        if g.sparse_offload is not None and g.sparse_offload.enabled:
            continue  # the full KV lives in the host pool; the device keeps a top-k buffer
        c.err(
            (role, "kv_cache_memory_bytes" if cap.kv_memory_set else "tp"),
            f"a device keeps {cap.kv_gb:.1f} GB for KV ({_kv_from(cap)}), {tokens} tokens "
            f"at {cap.token_bytes} B a token, less than one max_model_len {max_len} sequence; "
            "vLLM refuses to start. Raise tp, gpu_memory_utilization or kv_cache_memory_bytes, "
            "or lower max_model_len.",
            on_hardware=True,
        )


def _kv_from(cap: GroupCapacity) -> str:
    if cap.kv_memory_set:
        return "kv_cache_memory_bytes"
    return f"{cap.usable_gb:.1f} GB usable - {cap.weights_per_device_gb:.1f} GB of weights"


def _weights_fit(c: Checker, role: str, cap: GroupCapacity) -> bool:
    per_dev = cap.weights_per_device_gb or 0.0
    share = f"{cap.weights_gb:g} GB / {cap.shards} devices = {per_dev:.1f} GB a device"
    if cap.kv_memory_gb is not None:
        if per_dev + cap.kv_memory_gb <= cap.device_gb:
            return True
        c.err(
            (role, "kv_cache_memory_bytes"),
            f"the weights ({share}) + kv_cache_memory_bytes {cap.kv_memory_gb:.1f} GB exceed "
            f"the device's {cap.device_gb:g} GB. Lower kv_cache_memory_bytes or raise tp.",
            on_hardware=True,
        )
        return False
    if per_dev < cap.usable_gb:
        return True
    c.err(
        (role, "tp"),
        f"the weights ({share}) do not fit {cap.device_gb:g} GB x gpu_memory_utilization "
        f"{cap.util:g} = {cap.usable_gb:.1f} GB. Raise tp (or pp), or check model.weights_gb "
        "and hosts.<h>.device_memory_gb.",
        on_hardware=True,
    )
    return False


def rule_sparse_pool_one_sequence(c: Checker) -> None:
    """The decode host pool holds the full KV of every sequence: at least one of max_model_len
    (with max_num_seqs set, the offload rules check all of them)."""
    d = c.p.decode
    if d is None or d.sparse_offload is None or not d.sparse_offload.enabled:
        return
    opts = merged(c.p, d)
    max_len = opts.max_model_len or c.p.model.max_model_len
    if max_len is None or opts.max_num_seqs is not None:
        return
    need = kv_bytes(c.p.model, max_len)
    pool = d.sparse_offload.dram_size_per_dp_gb
    if need is not None and need > pool * GiB:
        c.err(
            ("decode", "sparse_offload", "dram_size_per_dp_gb"),
            f"{pool} GB cannot hold one max_model_len sequence ({max_len} tokens = "
            f"{need / GiB:.1f} GiB of KV). Use at least {-(-need // GiB)}.",
        )


def rule_device_count(c: Checker) -> None:
    """A declared `devices` the hardware does not come in: often chips written where the
    hardware counts dies (A3), which halves the memory a newcomer expects."""
    for name, h in c.p.hosts.items():
        hw = h.hardware or c.p.hardware
        if h.devices is None or hw not in ASCEND:
            continue
        k = KINDS[hw]
        if h.devices in k.per_server:
            continue
        usual = " or ".join(map(str, k.per_server))
        hint = ""
        if k.dies_per_chip > 1:
            hint = (
                f" devices: {h.devices} is {h.devices / k.dies_per_chip:g} chips; if you "
                f"counted chips, write devices: {h.devices * k.dies_per_chip}."
            )
        c.warn(
            ("hosts", name, "devices"),
            f"{hw} counts {k.unit}s ({k.server}); a server has {usual}, not {h.devices}."
            f"{hint} Keep it if only {h.devices} are yours.",
            on_hardware=True,
        )


def rule_bench_fits_prefill(c: Checker) -> None:
    """The guides keep a bench's prompts within the prefill instances' HBM KV cache (else the
    HBM prefix cache evicts what the next round should hit)."""
    g = c.p.prefill or c.p.mixed
    role = "prefill" if c.p.prefill else "mixed"
    if g is None or any(h not in c.p.hosts for h in g.hosts):
        return
    cap = group_capacity(c.p, role, g)
    tokens = None if cap is None else cap.tokens
    if tokens is None:
        return
    b = c.p.bench
    fit = g.instances * g.dp * (tokens // b.input_len)
    if fit < b.num_prompts:
        c.warn(
            ("bench", "num_prompts"),
            f"{fit} of the bench's {b.num_prompts} prompts of {b.input_len} tokens fit the "
            f"{role} instances' HBM KV cache ({g.instances * g.dp} DP ranks x {tokens} tokens); "
            f"the rest evicts prefixes. Bench at most {fit} prompts, or add {role} capacity.",
            on_hardware=True,
        )
