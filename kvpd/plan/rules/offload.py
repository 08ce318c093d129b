"""Layerwise prefill offload (AscendStore), sparse decode offload, MemFabric."""

from __future__ import annotations

from kvpd.plan.facts import GroupFacts
from kvpd.plan.kvconfig import memfabric_protocol
from kvpd.plan.layout import hardware_of
from kvpd.plan.rules.base import Checker
from kvpd.plan.rules.flags import arg_value
from kvpd.plan.sizing import GiB, kv_bytes
from kvpd.profile.roles import Role
from kvpd.profile.schema import Layerwise, SparseOffload

MEMFABRIC_PROTOCOLS = {"a3": ("sdma", "device_rdma"), "950": ("device_urma",)}


def rule_layerwise(c: Checker) -> None:
    for gf in c.gfacts():
        lw = gf.group.layerwise
        if lw is None:
            continue
        if "ascend_store" not in gf.group.kv_connectors:
            c.err(
                (gf.role, "layerwise"),
                "layerwise settings belong to AscendStoreConnector: add ascend_store to "
                "`kv_connectors`.",
            )
            continue
        _layerwise_needs(c, gf, lw)
        _layerwise_parallel(c, gf, lw)
        _layerwise_layers(c, gf, lw)


def _layerwise_needs(c: Checker, gf: GroupFacts, lw: Layerwise) -> None:
    """Where layerwise offload runs and what it needs: prefill, memcache, eager, MLA-style."""
    role = gf.role
    path = (role, "layerwise")
    if role == Role.DECODE:
        c.warn(
            path,
            "layerwise AscendStore on decode is not what the guide validates "
            "(use_layerwise is documented as prefill-only). Prefer layerwise on prefill only.",
        )
    if lw.backend != "memcache" or not lw.use_layerwise:
        c.err(
            path,
            f"layerwise offload on {role} needs backend memcache and use_layerwise: true "
            "(otherwise the GVA layerwise path is off). Set both.",
        )
    elif c.p.kv.memcache is None:
        c.err(
            ("kv", "memcache"),
            f"layerwise offload on {role} needs the memcache MetaService: "
            "add `kv.memcache: {host: <host>}`.",
        )
    if gf.opts.enforce_eager is False:
        c.err(
            (role, "enforce_eager"),
            f"layerwise offload on {role} requires eager mode; remove `enforce_eager: false`.",
        )
    if c.p.model.attention not in ("mla", "sfa", "dsa"):
        c.err(
            ("model", "attention"),
            f"layerwise offload on {role} needs an MLA, SFA or DSA "
            f"attention model, not {c.p.model.attention}. Drop `layerwise:` for this model "
            "(or fix model.attention).",
        )


def _layerwise_parallel(c: Checker, gf: GroupFacts, lw: Layerwise) -> None:
    """Context and pipeline parallelism, and the TP of every group reading the pool."""
    role, g = gf.role, gf.group
    if g.cp > 1:
        c.warn(
            (role, "cp"),
            "context parallelism is not validated with layerwise offload (the CP "
            "attention variants have no layerwise hooks). Prefer cp: 1.",
        )
    if g.pp > 1 and lw.backend == "memcache":
        c.warn(
            (role, "pp"),
            "pipeline parallelism with the memcache pool is a known incompatibility "
            "(vllm-ascend #13418). Prefer pp: 1.",
        )
    for other in c.gfacts():
        if other.role != role and "ascend_store" in other.connectors and other.group.tp != g.tp:
            c.err(
                (other.role, "tp"),
                f"{role} saves layerwise KV to the pool with tp {g.tp} but {other.role} "
                f"reads it with tp {other.group.tp}; AscendStore refuses a TP mismatch with "
                "layerwise transfer. Use the same tp on both.",
            )


def _layerwise_layers(c: Checker, gf: GroupFacts, lw: Layerwise) -> None:
    """independent_layers and num_shared_buffers: whether buffers are reused at all."""
    path = (gf.role, "layerwise")
    layers = c.p.model.layers
    il = lw.independent_layers
    if il == "all":
        c.warn(
            (*path, "independent_layers"),
            "independent_layers: all disables buffer reuse. Use a list (e.g. [0]) to reuse "
            "buffers.",
        )
    elif layers is not None:
        _layer_indices(c, path, lw, layers)
    if lw.num_shared_buffers is None:
        c.warn(
            (*path, "num_shared_buffers"),
            "unset: every layer gets its own buffer, no reuse. Set it (the guide uses 3).",
        )
    if "mooncake_layerwise" in gf.group.kv_connectors and il != "all":
        c.err(
            (gf.role, "kv_connectors"),
            "MooncakeLayerwiseConnector cannot be combined with "
            "layerwise buffer reuse (no per-buffer transfer completion gating yet). Set "
            "layerwise.independent_layers: all or drop mooncake_layerwise.",
        )


def _layer_indices(c: Checker, path: tuple[str, ...], lw: Layerwise, layers: int) -> None:
    il = lw.independent_layers
    assert il != "all"
    bad = [i for i in il if not -layers <= i < layers]
    if bad:
        c.err(
            (*path, "independent_layers"),
            f"layer index {bad[0]} is out of range for "
            f"a model with {layers} layers (use 0..{layers - 1}, negatives count from "
            'the end, or "all").',
        )
    reusable = layers - len(set(i % layers for i in il))
    if lw.num_shared_buffers is not None and lw.num_shared_buffers >= reusable:
        c.warn(
            (*path, "num_shared_buffers"),
            f"{lw.num_shared_buffers} shared buffers for "
            f"{reusable} reusable layers: no reuse happens (needs fewer buffers than "
            f"layers). Use at most {max(1, reusable - 1)}.",
        )


def rule_sparse(c: Checker) -> None:
    for gf in c.gfacts():
        role, g = gf.role, gf.group
        so = g.sparse_offload
        if so is None or not so.enabled:
            if role == Role.DECODE and "sfa_d2h" in g.kv_connectors:
                c.err(
                    (role, "sparse_offload"),
                    "SfaRemoteD2HConnector on decode runs with sparse "
                    "KV offload enabled: add `sparse_offload: {topk_buffer_size: ...}`.",
                )
            continue
        if role != Role.DECODE:
            c.err(
                (role, "sparse_offload"),
                f"sparse KV offload runs only on decode (a {role} engine with it is refused "
                f"by vLLM-Ascend). Remove sparse_offload from {role}.",
            )
            continue
        _sparse_role(c, gf, so)
        _sparse_model(c, gf)
        _sparse_engine(c, gf)
        _sparse_buffer(c, gf, so)
        _sparse_memory(c, gf, so)


def _sparse_role(c: Checker, gf: GroupFacts, so: SparseOffload) -> None:
    if so.keep_device_kv_cache:
        c.warn(
            (gf.role, "sparse_offload", "keep_device_kv_cache"),
            "keep_device_kv_cache is a debug-only option (it keeps the full device KV "
            "cache and defeats the offload). Set it to false in production.",
        )
    elif (gf.group.kv_role or "kv_consumer") != "kv_consumer":
        c.err(
            (gf.role, "kv_role"),
            f"sparse KV offload needs decode with kv_role kv_consumer, not {gf.group.kv_role}. "
            "Remove kv_role (kv_consumer is the default).",
        )


def _sparse_model(c: Checker, gf: GroupFacts) -> None:
    """The model sparse offload works for: BF16, uncompressed, one latent head, index_topk."""
    m = c.p.model
    if m.dtype not in ("bfloat16", "auto"):
        c.err(
            ("model", "dtype"),
            f"sparse KV offload requires a BF16 main SFA cache, but the model dtype is "
            f"{m.dtype}. Serve the model in bfloat16 or drop sparse_offload.",
        )
    kv_dtype = arg_value(list(gf.opts.args or []), "--kv-cache-dtype")
    if kv_dtype not in (None, "auto", "bfloat16"):
        c.err(
            (gf.role, "args"),
            f"sparse KV offload requires a BF16 main cache; --kv-cache-dtype {kv_dtype} "
            "is refused at cache registration. Remove it.",
        )
    if m.compressed:
        c.err(
            ("model", "compressed"),
            "sparse KV offload does not support compressed (compress_ratios) models. "
            "Drop sparse_offload for this model.",
        )
    if m.attention not in ("mla", "sfa", "dsa"):
        c.err(
            ("model", "attention"),
            f"sparse KV offload supports only SFA/MLA-style models (one latent KV head); "
            f"{m.attention} is not one. Drop sparse_offload for this model.",
        )
    if m.index_topk is None:
        c.err(
            ("model", "index_topk"),
            "sparse KV offload works only for sparse-attention "
            "models: set model.index_topk (from config.json) if the model has one.",
        )


def _sparse_engine(c: Checker, gf: GroupFacts) -> None:
    """The engine settings sparse offload refuses: CP, PP, Model Runner V2, SFA C8, and a
    decode without SfaRemoteD2H."""
    role, g = gf.role, gf.group
    if g.cp > 1:
        c.err((role, "cp"), "sparse KV offload does not support context parallel. Set cp: 1.")
    if g.pp > 1:
        c.err((role, "pp"), "sparse KV offload does not support pipeline parallel. Set pp: 1.")
    if g.model_runner_v2 or gf.env.get("VLLM_USE_V2_MODEL_RUNNER", "0") not in ("0", ""):
        c.err(
            (role, "model_runner_v2"),
            "sparse KV offload needs Model Runner V1. Set model_runner_v2: false and "
            "VLLM_USE_V2_MODEL_RUNNER=0 (or leave both unset).",
        )
    add = gf.opts.additional_config or {}
    if g.sfa_c8 or add.get("enable_sparse_sfa_c8"):
        c.err(
            (role, "sfa_c8"),
            "sparse KV offload cannot be combined with sparse SFA C8 (vLLM-Ascend raises "
            "NotImplementedError). Turn off sfa_c8 / enable_sparse_sfa_c8.",
        )
    if "sfa_d2h" not in g.kv_connectors:
        c.err(
            (role, "kv_connectors"),
            "sparse KV offload on decode goes with "
            "SfaRemoteD2HConnector: add sfa_d2h to kv_connectors.",
        )


def _sparse_buffer(c: Checker, gf: GroupFacts, so: SparseOffload) -> None:
    """topk_buffer_size: positive, at least index_topk, a multiple of the block size."""
    path = (gf.role, "sparse_offload", "topk_buffer_size")
    topk = c.p.model.index_topk
    tb = so.topk_buffer_size
    block = gf.block_size
    if tb <= 0:
        c.err(
            path,
            f"{tb} must be positive; use a multiple of block_size {block} that is at least "
            "index_topk.",
        )
    elif topk is not None and tb < topk:
        c.err(
            path,
            f"{tb} is smaller than index_topk {topk}; "
            f"use at least {topk} (2 x index_topk = {2 * topk} is a good "
            "start).",
        )
    if tb > 0 and tb % block:
        up = -(-tb // block) * block
        c.err(path, f"{tb} is not divisible by block_size {block}; use {up}.")


def _sparse_memory(c: Checker, gf: GroupFacts, so: SparseOffload) -> None:
    """dram_size_per_dp_gb: holds one DP rank's full KV cache, and the host's ranks fit."""
    path = (gf.role, "sparse_offload", "dram_size_per_dp_gb")
    max_len = gf.max_model_len
    seqs = gf.opts.max_num_seqs
    need = kv_bytes(c.p.model, max_len * seqs) if max_len and seqs else None
    if need is not None and need > so.dram_size_per_dp_gb * GiB:
        gb = -(-need // GiB)
        c.err(
            path,
            f"{so.dram_size_per_dp_gb} GB cannot hold "
            f"the full KV cache of one DP rank ({max_len} tokens x {seqs} seqs = "
            f"{need / GiB:.1f} GiB). Use at least {gb}.",
        )
    local_ranks: dict[str, int] = {}
    for ep in c.layout.procs:
        if ep.role == gf.role:
            local_ranks[ep.host] = local_ranks.get(ep.host, 0) + len(ep.dp_ranks)
    for h, n in local_ranks.items():
        mem = c.p.hosts[h].memory_gb
        if mem is not None and so.dram_size_per_dp_gb * n > mem:
            c.err(
                path,
                f"{n} DP ranks x {so.dram_size_per_dp_gb} "
                f"GB on '{h}' exceed its memory_gb {mem:g}. Lower dram_size_per_dp_gb to "
                f"{int(mem // n)} or less.",
            )


def rule_memfabric(c: Checker) -> None:
    protos: dict[str, str] = {}
    for role, g in c.groups():
        if "sfa_d2h" not in g.kv_connectors:
            continue
        proto = memfabric_protocol(c.p, g) or "sdma"
        protos[role] = proto
        for h in g.hosts:
            hw = hardware_of(c.p, h)
            ok = MEMFABRIC_PROTOCOLS.get(hw)
            if ok is None:
                c.err(
                    (role, "hosts"),
                    f"layerwise/sparse offload (SfaRemoteD2H over MemFabric) is "
                    f"supported on A3 and 950 only; host '{h}' is {hw}. Run this group on A3 "
                    "or 950 hosts, or use another connector.",
                    on_hardware=True,
                )
                break
            if proto not in ok:
                c.err(
                    (role, "memfabric_protocol"),
                    f"memfabric protocol {proto} is not valid on {hw} (use {' or '.join(ok)}).",
                    on_hardware=True,
                )
                break
    if len(set(protos.values())) > 1:
        on_950 = any(
            c.f.hardware(h) == "950"
            for role in protos
            for h in c.p.engine_group(role).hosts
            if h in c.p.hosts
        )
        want = "device_urma" if on_950 else protos.get("prefill", "sdma")
        shown = ", ".join(f"{r} {v}" for r, v in protos.items())
        c.err(
            ("decode", "memfabric_protocol"),
            f"memfabric protocols differ ({shown}); prefill and decode must use the same one"
            + (" and 950 hosts require device_urma on both sides" if on_950 else "")
            + f". Set memfabric_protocol: {want} on both groups.",
        )
