"""Layerwise prefill offload (AscendStore), sparse decode offload, MemFabric."""

from __future__ import annotations

from kvpd.plan.kvconfig import memfabric_protocol
from kvpd.plan.layout import hardware_of
from kvpd.plan.rules.base import Checker
from kvpd.plan.rules.flags import arg_value
from kvpd.plan.sizing import GiB, kv_bytes

MEMFABRIC_PROTOCOLS = {"a3": ("sdma", "device_rdma"), "950": ("device_urma",)}


def rule_layerwise(c: Checker) -> None:
    for gf in c.gfacts():
        role, g = gf.role, gf.group
        lw = g.layerwise
        if lw is None:
            continue
        path = (role, "layerwise")
        if "ascend_store" not in g.kv_connectors:
            c.err(
                path,
                "layerwise settings belong to AscendStoreConnector: add ascend_store to "
                "`kv_connectors`.",
            )
            continue
        if role == "decode":
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
        opts = gf.opts
        if opts.enforce_eager is False:
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
            if (
                other.role != role
                and "ascend_store" in other.connectors
                and (other.group.tp != g.tp)
            ):
                c.err(
                    (other.role, "tp"),
                    f"{role} saves layerwise KV to the pool with tp {g.tp} but {other.role} "
                    f"reads it with tp {other.group.tp}; AscendStore refuses a TP mismatch with "
                    "layerwise transfer. Use the same tp on both.",
                )
        layers = c.p.model.layers
        il = lw.independent_layers
        if il == "all":
            c.warn(
                (*path, "independent_layers"),
                "independent_layers: all disables buffer reuse. Use a list (e.g. [0]) to reuse "
                "buffers.",
            )
        elif layers is not None:
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
        if lw.num_shared_buffers is None:
            c.warn(
                (*path, "num_shared_buffers"),
                "unset: every layer gets its own buffer, no reuse. Set it (the guide uses 3).",
            )
        if "mooncake_layerwise" in g.kv_connectors and il != "all":
            c.err(
                (role, "kv_connectors"),
                "MooncakeLayerwiseConnector cannot be combined with "
                "layerwise buffer reuse (no per-buffer transfer completion gating yet). Set "
                "layerwise.independent_layers: all or drop mooncake_layerwise.",
            )


def rule_sparse(c: Checker) -> None:
    m = c.p.model
    for gf in c.gfacts():
        role, g, opts = gf.role, gf.group, gf.opts
        so = g.sparse_offload
        uses_sfa = "sfa_d2h" in g.kv_connectors
        if so is None or not so.enabled:
            if role == "decode" and uses_sfa:
                c.err(
                    (role, "sparse_offload"),
                    "SfaRemoteD2HConnector on decode runs with sparse "
                    "KV offload enabled: add `sparse_offload: {topk_buffer_size: ...}`.",
                )
            continue
        path = (role, "sparse_offload")
        if role != "decode":
            c.err(
                path,
                f"sparse KV offload runs only on decode (a {role} engine with it is refused "
                f"by vLLM-Ascend). Remove sparse_offload from {role}.",
            )
            continue
        if so.keep_device_kv_cache:
            c.warn(
                (*path, "keep_device_kv_cache"),
                "keep_device_kv_cache is a debug-only option (it keeps the full device KV "
                "cache and defeats the offload). Set it to false in production.",
            )
        elif (g.kv_role or "kv_consumer") != "kv_consumer":
            c.err(
                (role, "kv_role"),
                f"sparse KV offload needs decode with kv_role kv_consumer, not {g.kv_role}. "
                "Remove kv_role (kv_consumer is the default).",
            )
        if m.dtype not in ("bfloat16", "auto"):
            c.err(
                ("model", "dtype"),
                f"sparse KV offload requires a BF16 main SFA cache, but the model dtype is "
                f"{m.dtype}. Serve the model in bfloat16 or drop sparse_offload.",
            )
        kv_dtype = arg_value(list(opts.args or []), "--kv-cache-dtype")
        if kv_dtype not in (None, "auto", "bfloat16"):
            c.err(
                (role, "args"),
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
        if g.cp > 1:
            c.err((role, "cp"), "sparse KV offload does not support context parallel. Set cp: 1.")
        if g.pp > 1:
            c.err((role, "pp"), "sparse KV offload does not support pipeline parallel. Set pp: 1.")
        env = gf.env
        if g.model_runner_v2 or env.get("VLLM_USE_V2_MODEL_RUNNER", "0") not in ("0", ""):
            c.err(
                (role, "model_runner_v2"),
                "sparse KV offload needs Model Runner V1. Set model_runner_v2: false and "
                "VLLM_USE_V2_MODEL_RUNNER=0 (or leave both unset).",
            )
        add = opts.additional_config or {}
        if g.sfa_c8 or add.get("enable_sparse_sfa_c8"):
            c.err(
                (role, "sfa_c8"),
                "sparse KV offload cannot be combined with sparse SFA C8 (vLLM-Ascend raises "
                "NotImplementedError). Turn off sfa_c8 / enable_sparse_sfa_c8.",
            )
        if not uses_sfa:
            c.err(
                (role, "kv_connectors"),
                "sparse KV offload on decode goes with "
                "SfaRemoteD2HConnector: add sfa_d2h to kv_connectors.",
            )
        tb = so.topk_buffer_size
        block = gf.block_size
        if tb <= 0:
            c.err(
                (*path, "topk_buffer_size"),
                f"{tb} must be positive; use a multiple of block_size {block} that is at least "
                "index_topk.",
            )
        elif m.index_topk is not None and tb < m.index_topk:
            c.err(
                (*path, "topk_buffer_size"),
                f"{tb} is smaller than index_topk {m.index_topk}; "
                f"use at least {m.index_topk} (2 x index_topk = {2 * m.index_topk} is a good "
                "start).",
            )
        if tb > 0 and tb % block:
            up = -(-tb // block) * block
            c.err(
                (*path, "topk_buffer_size"),
                f"{tb} is not divisible by block_size {block}; use {up}.",
            )
        max_len = gf.max_model_len
        seqs = opts.max_num_seqs
        if max_len and seqs:
            need = kv_bytes(m, max_len * seqs)
            if need is not None and need > so.dram_size_per_dp_gb * GiB:
                gb = -(-need // GiB)
                c.err(
                    (*path, "dram_size_per_dp_gb"),
                    f"{so.dram_size_per_dp_gb} GB cannot hold "
                    f"the full KV cache of one DP rank ({max_len} tokens x {seqs} seqs = "
                    f"{need / GiB:.1f} GiB). Use at least {gb}.",
                )
        local_ranks: dict[str, int] = {}
        for ep in c.layout.procs:
            if ep.role == role:
                local_ranks[ep.host] = local_ranks.get(ep.host, 0) + len(ep.dp_ranks)
        for h, n in local_ranks.items():
            mem = c.p.hosts[h].memory_gb
            if mem is not None and so.dram_size_per_dp_gb * n > mem:
                c.err(
                    (*path, "dram_size_per_dp_gb"),
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
            for h in getattr(c.p, role).hosts
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
