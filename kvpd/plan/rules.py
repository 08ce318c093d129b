"""Cross-field rules from the guides and the vLLM-Ascend / KV-store code (pure).

Each rule appends `Finding`s: errors stop the plan, warnings are shown with it. A finding names
the profile field it is about; the loader turns that into `file:line: field: message`.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from kvpd.plan.kvconfig import memfabric_protocol
from kvpd.plan.layout import Layout, dp_size_local, hardware_of, host_devices, merged
from kvpd.plan.planner_rules import planner_findings
from kvpd.plan.processes import Proc, proxy_flow
from kvpd.plan.sizing import GiB, kv_bytes, parse_size
from kvpd.profile.schema import ASCEND, Group, Profile

Path_ = tuple[str | int, ...]

ASCEND_ONLY = {"sfa_d2h", "ascend_store", "mooncake", "mooncake_layerwise", "ucm"}
MEMFABRIC_PROTOCOLS = {"a3": ("sdma", "device_rdma"), "950": ("device_urma",)}
MEMCACHE_PROTOCOLS = {
    "a2": ("device_rdma", "host_rdma", "host_tcp"),
    "a3": ("device_sdma", "host_rdma", "host_tcp"),
    "950": ("device_urma", "device_uboe", "host_urma", "host_tcp"),
    "cpu": ("host_tcp", "host_shm"),
    "cuda": ("host_rdma", "host_tcp"),
}


@dataclass(frozen=True)
class Finding:
    path: Path_
    message: str
    error: bool = True


class Checker:
    def __init__(self, profile: Profile, layout: Layout, procs: list[Proc], rehearse: bool) -> None:
        self.p = profile
        self.layout = layout
        self.procs = procs
        self.rehearse = rehearse
        self.findings: list[Finding] = []

    def err(self, path: Path_, msg: str) -> None:
        self.findings.append(Finding(tuple(path), msg, True))

    def warn(self, path: Path_, msg: str) -> None:
        self.findings.append(Finding(tuple(path), msg, False))

    def groups(self) -> list[tuple[str, Group]]:
        return [(r, g) for r in ("prefill", "decode", "mixed") if (g := getattr(self.p, r))]


def check(
    profile: Profile, layout: Layout, procs: list[Proc], rehearse: bool = False
) -> list[Finding]:
    c = Checker(profile, layout, procs, rehearse)
    for rule in RULES:
        rule(c)
    c.findings += planner_findings(profile)
    for path, msg in layout.problems:
        c.err(path, msg)
    return c.findings


# --- hosts and topology ----------------------------------------------------------------------


def _host_ref(c: Checker, path: Path_, name: str) -> None:
    if name not in c.p.hosts:
        close = difflib.get_close_matches(name, list(c.p.hosts), n=1, cutoff=0.5)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        c.err(path, f"unknown host '{name}'.{hint} Declared hosts: {', '.join(c.p.hosts)}.")


def rule_host_refs(c: Checker) -> None:
    for role, g in c.groups():
        for i, h in enumerate(g.hosts):
            _host_ref(c, (role, "hosts", i), h)
        if g.dp_address:
            _host_ref(c, (role, "dp_address"), g.dp_address)
    kv = c.p.kv
    if kv.memcache:
        _host_ref(c, ("kv", "memcache", "host"), kv.memcache.host)
    if kv.mooncake:
        _host_ref(c, ("kv", "mooncake", "host"), kv.mooncake.host)
    if c.p.proxy:
        _host_ref(c, ("proxy", "host"), c.p.proxy.host)
    addrs: dict[str, str] = {}
    for name, h in c.p.hosts.items():
        if h.address in addrs:
            c.err(
                ("hosts", name, "address"),
                f"address {h.address} is also host '{addrs[h.address]}'. Each host needs its "
                "own address (list it once and give its engines different ports).",
            )
        addrs[h.address] = name


def rule_groups_present(c: Checker) -> None:
    p = c.p
    if not (p.prefill or p.decode or p.mixed):
        c.err(("prefill",), "no engines: add `prefill:` and `decode:` groups (P/D) or `mixed:`.")
        return
    if bool(p.prefill) != bool(p.decode):
        have, miss = ("prefill", "decode") if p.prefill else ("decode", "prefill")
        c.err(
            (have,),
            f"`{have}:` without `{miss}:`. P/D needs both groups; a single "
            "group of engines that prefill and decode is `mixed:`.",
        )
    if p.prefill and p.decode:
        for role in ("prefill", "decode"):
            g = getattr(p, role)
            if not g.kv_connectors:
                c.err(
                    (role, "kv_connectors"),
                    f"{role} has no KV connector, so KV cannot move "
                    "from prefill to decode. Set e.g. `kv_connectors: [mooncake]`.",
                )
        if p.proxy is None:
            c.err(
                ("proxy",),
                "P/D needs a proxy in front of the engines. Add `proxy: {host: "
                "<host>, port: <port>}`.",
            )


def rule_parallelism(c: Checker) -> None:
    for role, g in c.groups():
        if any(h not in c.p.hosts for h in g.hosts):
            continue
        local = dp_size_local(c.p, g)
        for h in g.hosts:
            devs = host_devices(c.p, c.p.hosts[h])
            if g.tp * g.pp > devs:
                c.err(
                    (role, "tp"),
                    f"tp {g.tp} x pp {g.pp} needs {g.tp * g.pp} devices on one "
                    f"host but '{h}' has {devs}. Lower tp or set `hosts.{h}.devices`.",
                )
                return
            if local * g.tp * g.pp > devs:
                c.err(
                    (role, "dp_size_local"),
                    f"dp_size_local {local} x tp {g.tp} x pp {g.pp} "
                    f"= {local * g.tp * g.pp} devices per host, but '{h}' has {devs}. "
                    f"Use dp_size_local <= {devs // (g.tp * g.pp)}.",
                )
                return
        if local > g.dp:
            c.err((role, "dp_size_local"), f"dp_size_local {local} is larger than dp {g.dp}.")
        elif g.dp % local:
            c.err(
                (role, "dp_size_local"),
                f"dp {g.dp} is not a multiple of dp_size_local "
                f"{local}: every host must hold the same number of DP ranks.",
            )
        if g.dp_launch == "single" and local < g.dp:
            c.err(
                (role, "dp_launch"),
                f"dp_launch single runs all {g.dp} DP ranks in one "
                f"process, but only {local} fit on a host. Use dp_launch: per_rank.",
            )
        covered = sorted(r for ep in c.layout.procs if ep.role == role for r in ep.dp_ranks)
        want = sorted(list(range(g.dp)) * g.instances)
        if not c.layout.problems and covered != want:
            c.err(
                (role, "dp"),
                f"DP ranks placed {covered} do not cover 0..{g.dp - 1} exactly once per instance.",
            )
    p, d = c.p.prefill, c.p.decode
    if p and d:
        needs_ratio = {"sfa_d2h", "mooncake", "mooncake_layerwise"} & (
            set(p.kv_connectors) | set(d.kv_connectors)
        )
        if needs_ratio and (p.tp < d.tp or p.tp % d.tp):
            c.err(
                ("prefill", "tp"),
                f"prefill tp {p.tp} must be >= decode tp {d.tp} and "
                f"divisible by it ({', '.join(sorted(needs_ratio))} maps each prefill rank to "
                f"decode rank p_rank // (p_tp / d_tp)). Use e.g. prefill tp "
                f"{d.tp * max(1, p.tp // d.tp)}.",
            )
        if d.pp > 1 and (set(d.kv_connectors) & {"mooncake", "mooncake_layerwise", "sfa_d2h"}):
            c.err(("decode", "pp"), "decode pp must be 1 with this KV connector.")


def rule_roles(c: Checker) -> None:
    for role, g in c.groups():
        if g.kv_role == "kv_consumer" and role == "prefill":
            c.err(
                (role, "kv_role"),
                "prefill cannot be kv_consumer: it produces KV. Use kv_producer (or kv_both).",
            )
        if g.kv_role == "kv_producer" and role == "decode":
            c.err(
                (role, "kv_role"),
                "decode cannot be kv_producer: it consumes KV. Use kv_consumer (or kv_both).",
            )
        if not c.rehearse:
            for comp in g.kv_connectors:
                hws = {hardware_of(c.p, h) for h in g.hosts}
                if comp in ASCEND_ONLY and not hws & set(ASCEND):
                    c.err(
                        (role, "kv_connectors"),
                        f"{comp} runs only on Ascend hosts, but "
                        f"{role} runs on {', '.join(sorted(hws))}. On cpu/cuda use "
                        "kvpd_store, example or nixl (or `kvpd up --rehearse`).",
                    )
        comps = g.kv_connectors
        if len(set(comps)) != len(comps):
            c.err((role, "kv_connectors"), "a KV connector is listed twice.")
        if "example" in comps and not c.p.kv.example_path:
            c.err(
                ("kv", "example_path"),
                "ExampleConnector needs a shared folder: set `kv.example_path`.",
            )
        if "kvpd_store" in comps and c.p.kv.kvpd_store is None:
            c.err(("kv", "kvpd_store"), "kvpd_store needs `kv.kvpd_store: {path: <folder>}`.")
        if "ucm" in comps and c.p.kv.ucm is None:
            c.err(("kv", "ucm"), "the ucm connector needs `kv.ucm: {storage: <shared dir>}`.")
        if set(comps) & {"mooncake", "mooncake_layerwise"} and c.p.kv.mooncake is None:
            c.err(
                ("kv", "mooncake"),
                "mooncake needs the master: add `kv.mooncake: {host: "
                "<host>}` (its address goes into every mooncake.json).",
            )


# --- layerwise prefill offload and sparse decode offload --------------------------------------


def rule_layerwise(c: Checker) -> None:
    for role, g in c.groups():
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
                "(use_layerwise is documented as prefill-only).",
            )
        if lw.backend != "memcache" or not lw.use_layerwise:
            c.err(
                path,
                "layerwise prefill offload needs backend memcache and use_layerwise: true "
                "(otherwise the GVA layerwise path is off).",
            )
        elif c.p.kv.memcache is None:
            c.err(
                ("kv", "memcache"),
                "layerwise prefill offload needs the memcache MetaService: "
                "add `kv.memcache: {host: <host>}`.",
            )
        opts = merged(c.p, g)
        if opts.enforce_eager is False:
            c.err(
                (role, "enforce_eager"),
                "layerwise prefill offload requires eager mode; remove `enforce_eager: false`.",
            )
        if c.p.model.attention not in ("mla", "sfa", "dsa"):
            c.err(
                ("model", "attention"),
                f"layerwise prefill offload needs an MLA, SFA or DSA "
                f"attention model, not {c.p.model.attention}.",
            )
        if g.cp > 1:
            c.warn((role, "cp"), "context parallelism is not validated with layerwise offload.")
        layers = c.p.model.layers
        il = lw.independent_layers
        if il == "all":
            c.warn((*path, "independent_layers"), "independent_layers: all disables buffer reuse.")
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
                    "layers).",
                )
        if lw.num_shared_buffers is None:
            c.warn(
                (*path, "num_shared_buffers"), "unset: every layer gets its own buffer, no reuse."
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
    for role, g in c.groups():
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
            c.err(path, "sparse KV offload runs only on decode. Do not set it on prefill.")
            continue
        if not so.keep_device_kv_cache and (g.kv_role or "kv_consumer") != "kv_consumer":
            c.err((role, "kv_role"), "sparse KV offload needs decode with kv_role kv_consumer.")
        if m.compressed:
            c.err(
                ("model", "compressed"),
                "sparse KV offload does not support compressed (compress_ratios) models.",
            )
        if m.index_topk is None:
            c.err(
                ("model", "index_topk"),
                "sparse KV offload works only for sparse-attention "
                "models: set model.index_topk (from config.json) if the model has one.",
            )
        if g.cp > 1:
            c.err((role, "cp"), "sparse KV offload does not support context parallel.")
        if g.pp > 1:
            c.err((role, "pp"), "sparse KV offload does not support pipeline parallel.")
        if g.model_runner_v2:
            c.err((role, "model_runner_v2"), "sparse KV offload needs Model Runner V1.")
        if g.sfa_c8:
            c.err((role, "sfa_c8"), "sparse KV offload cannot be combined with sparse SFA C8.")
        if not uses_sfa:
            c.err(
                (role, "kv_connectors"),
                "sparse KV offload on decode goes with "
                "SfaRemoteD2HConnector: add sfa_d2h to kv_connectors.",
            )
        tb = so.topk_buffer_size
        block = merged(c.p, g).block_size or m.block_size
        if tb <= 0:
            c.err((*path, "topk_buffer_size"), "must be positive.")
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
        max_len = merged(c.p, g).max_model_len or m.max_model_len
        seqs = merged(c.p, g).max_num_seqs
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
                    f"GB on '{h}' exceed its memory_gb {mem:g}.",
                )


def rule_memfabric(c: Checker) -> None:
    protos: dict[str, str] = {}
    for role, g in c.groups():
        if "sfa_d2h" not in g.kv_connectors:
            continue
        proto = memfabric_protocol(c.p, g) or "sdma"
        protos[role] = proto
        if c.rehearse:
            continue
        for h in g.hosts:
            hw = hardware_of(c.p, h)
            ok = MEMFABRIC_PROTOCOLS.get(hw)
            if ok is None:
                c.err(
                    (role, "hosts"),
                    f"layerwise/sparse offload (SfaRemoteD2H over MemFabric) is "
                    f"supported on A3 and 950 only; host '{h}' is {hw}.",
                )
                break
            if proto not in ok:
                c.err(
                    (role, "memfabric_protocol"),
                    f"memfabric protocol {proto} is not valid on {hw} (use {' or '.join(ok)}).",
                )
                break
    if len(set(protos.values())) > 1:
        c.err(
            ("decode", "memfabric_protocol"),
            f"prefill uses memfabric protocol "
            f"{protos['prefill']} but decode uses {protos['decode']}; they must be identical.",
        )


# --- KV services -------------------------------------------------------------------------------


def memcache_ranks(profile: Profile, layout: Layout) -> int:
    """LocalService ranks that join memcache: every TP x PP rank of every memcache user."""
    n = 0
    for role in ("prefill", "decode", "mixed"):
        g = getattr(profile, role)
        if g is None or "ascend_store" not in g.kv_connectors:
            continue
        if g.layerwise is None or g.layerwise.backend == "memcache":
            n += sum(len(ep.dp_ranks) * g.tp * g.pp for ep in layout.procs if ep.role == role)
    return n


def rule_memcache(c: Checker) -> None:
    mc = c.p.kv.memcache
    if mc is None:
        return
    path = ("kv", "memcache")
    ports = {
        "port": mc.port,
        "config_store_port": mc.config_store_port,
        "metrics_port": mc.metrics_port,
    }
    if len(set(ports.values())) < 3:
        c.err(path, f"meta rpc, config store and metrics ports must differ: {ports}.")
    ranks = memcache_ranks(c.p, c.layout)
    if ranks > mc.world_size:
        c.err(
            (*path, "world_size"),
            f"world_size {mc.world_size} is below the {ranks} "
            "LocalService ranks that will join (every TP x DP rank of the memcache users). "
            f"Use at least {ranks}.",
        )
    if not c.rehearse and mc.host in c.p.hosts:
        hw = hardware_of(c.p, mc.host)
        users = [h for r, g in c.groups() if "ascend_store" in g.kv_connectors for h in g.hosts]
        hws = {hardware_of(c.p, h) for h in users} or {hw}
        for hwu in hws:
            ok = MEMCACHE_PROTOCOLS.get(hwu, ())
            if mc.protocol not in ok:
                c.err(
                    (*path, "protocol"),
                    f"protocol {mc.protocol} does not match {hwu} hardware "
                    f"(use {' or '.join(ok)}).",
                )
    if mc.dram_size != "auto":
        try:
            parse_size(mc.dram_size)
        except ValueError as e:
            c.err((*path, "dram_size"), f"{e}.")
    for key in list(mc.meta_extra) + list(mc.local_extra):
        if not key.startswith(("ock.mmc.", "ubsio.")):
            c.err(path, f"'{key}' is not a memcache key (they start with ock.mmc. or ubsio.).")


def rule_mooncake(c: Checker) -> None:
    mk = c.p.kv.mooncake
    if mk is None:
        return
    path = ("kv", "mooncake")
    users = [
        (r, g) for r, g in c.groups() if {"mooncake", "mooncake_layerwise"} & set(g.kv_connectors)
    ]
    if (
        not c.rehearse
        and users
        and any(hardware_of(c.p, h) in ASCEND for _, g in users for h in g.hosts)
        and mk.protocol != "ascend"
    ):
        c.err((*path, "protocol"), f"vLLM-Ascend accepts only protocol ascend, not {mk.protocol}.")
    try:
        seg = parse_size(mk.global_segment_size)
        if (
            not mk.global_segment_size.strip().lower().endswith(("gb", "mb", "kb", "b"))
            and not mk.global_segment_size.strip().isdigit()
        ):
            raise ValueError
        if seg % GiB:
            c.warn(
                (*path, "global_segment_size"),
                f"{mk.global_segment_size} is not a whole "
                "number of GB; vLLM-Ascend documents 1 GB alignment.",
            )
    except ValueError:
        c.err(
            (*path, "global_segment_size"),
            f"{mk.global_segment_size!r}: use a size with unit "
            "GB, MB, KB or B (e.g. 1GB); '1G' and '1GiB' are rejected by vLLM-Ascend.",
        )
    if not 0 < mk.eviction_ratio < 1:
        c.err((*path, "eviction_ratio"), "must be between 0 and 1.")
    if not c.rehearse:
        for role, _g in users:
            for ep in c.layout.procs:
                if ep.role != role or ep.kv_port is None:
                    continue
                devs = host_devices(c.p, c.p.hosts[ep.host])
                lo, hi = 20000, 20000 + devs * 1000
                if hardware_of(c.p, ep.host) in ASCEND and lo <= ep.kv_port < hi:
                    c.warn(
                        (role, "kv_port"),
                        f"kv_port {ep.kv_port} lies in [{lo}, {hi}), where "
                        "Ascend's direct transport picks random ports; a clash shows as "
                        "'ZMQError: Address already in use'. Prefer kv_port >= "
                        f"{hi} or set ASCEND_BASE_PORT.",
                    )
                    break


def rule_ucm(c: Checker) -> None:
    u = c.p.kv.ucm
    if u is None:
        return
    path = ("kv", "ucm")
    if "hit_ratio" in u.config:
        c.err(
            (*path, "config"),
            "hit_ratio switches UCM to its mock connector with fake hits; "
            "never use it in a deployment. Remove it.",
        )
    if u.connector == "UcmNfsStore" and u.enable_event_sync:
        c.err((*path, "enable_event_sync"), "must be false with UcmNfsStore.")
    if int(u.config.get("data_dir_shard_bytes", 3)) > 5:
        c.err((*path, "config"), "data_dir_shard_bytes must be <= 5.")
    users = [(r, g) for r, g in c.groups() if "ucm" in g.kv_connectors]
    for r, g in users:
        if g.pp > 1 and not u.use_layerwise:
            c.err((*path, "use_layerwise"), f"{r} uses pp {g.pp}: UCM needs use_layerwise: true.")
    hosts = {h for _, g in users for h in g.hosts}
    if len(hosts) > 1:
        if u.shared is False:
            c.err(
                (*path, "shared"),
                f"UCM is used on {len(hosts)} hosts ({', '.join(sorted(hosts))}) "
                "but its storage is not shared: they would not see each other's KV. Mount one "
                "shared filesystem (NFS/3FS) at the same path on all of them.",
            )
        elif u.shared is None:
            c.warn(
                (*path, "storage"),
                f"{u.storage} must be one shared filesystem on "
                f"{', '.join(sorted(hosts))}. Set `shared: true` once it is; `kvpd plan "
                "--check` verifies it by writing on one host and reading on the others.",
            )


def rule_consistency(c: Checker) -> None:
    p, d = c.p.prefill, c.p.decode
    if not (p and d):
        return
    po, do = merged(c.p, p), merged(c.p, d)
    if (po.block_size or c.p.model.block_size) != (do.block_size or c.p.model.block_size):
        c.err(
            ("decode", "block_size"),
            f"prefill block_size {po.block_size} differs from decode "
            f"{do.block_size}; KV blocks must have the same size on both sides.",
        )
    seeds = {
        r: {**c.p.env, **(merged(c.p, g).env or {})}.get("PYTHONHASHSEED")
        for r, g in (("prefill", p), ("decode", d))
    }
    if seeds["prefill"] != seeds["decode"]:
        c.err(
            ("decode", "env", "PYTHONHASHSEED"),
            f"PYTHONHASHSEED differs (prefill "
            f"{seeds['prefill']}, decode {seeds['decode']}); block hashes would not match. "
            "Set it once in the top-level `env:`.",
        )
    elif seeds["prefill"] is None and {"ascend_store", "mooncake", "mooncake_layerwise"} & (
        set(p.kv_connectors) | set(d.kv_connectors)
    ):
        c.warn(
            ("env",),
            "PYTHONHASHSEED is not set; KV-pool block hashes differ between processes "
            'unless it is identical everywhere. Add `env: {PYTHONHASHSEED: "0"}`.',
        )


def rule_proxy(c: Checker) -> None:
    px = c.p.proxy
    if px is None:
        return
    bind = px.bind
    if proxy_flow(c.p) == "layerwise" and bind in ("0.0.0.0", "::", "0:0:0:0:0:0:0:0"):
        c.err(
            ("proxy", "bind"),
            "the layerwise proxy must listen on an address decoders can "
            "reach (they call <proxy>/v1/metaserver); 0.0.0.0 is not one. Leave `bind` unset "
            "to use the proxy host's address.",
        )
    if px.impl == "vllm-ascend" and proxy_flow(c.p) == "mixed":
        c.err(
            ("proxy", "impl"),
            "vLLM-Ascend's example proxies need prefill and decode groups; "
            "for `mixed:` engines use impl: kvpd (it balances over them).",
        )
    if px.impl == "vllm-ascend" and px.script is None:
        c.warn(
            ("proxy", "script"),
            "path of vLLM-Ascend's example proxy not set; assuming the "
            "repository's examples/disaggregated_prefill_v1/ relative to the run directory.",
        )


def rule_ports(c: Checker) -> None:
    seen: dict[tuple[str, int], str] = {}
    for proc in c.procs:
        for port, purpose in proc.ports:
            if port > 65535:
                c.err(
                    _proc_path(proc),
                    f"{proc.name} needs port {port} ({purpose}), above 65535. "
                    "Lower its kv_port/port.",
                )
                continue
            key = (proc.host, port)
            owner = f"{proc.name} ({purpose})"
            if key in seen:
                c.err(
                    _proc_path(proc),
                    f"port {port} on host '{proc.host}' is used twice: "
                    f"{seen[key]} and {owner}. Move one of them (group `port`/`kv_port`).",
                )
            seen.setdefault(key, owner)


def _proc_path(proc: Proc) -> Path_:
    if proc.role in ("prefill", "decode", "mixed"):
        return (proc.role, "port")
    if proc.role == "metaservice":
        return ("kv", "memcache")
    if proc.role == "mooncake":
        return ("kv", "mooncake")
    return ("proxy", "port")


def rule_model(c: Checker) -> None:
    m = c.p.model
    if m.max_model_len is None and not any(merged(c.p, g).max_model_len for _, g in c.groups()):
        c.warn(
            ("model", "max_model_len"),
            "not set: vLLM uses the model's maximum, and kvpd cannot "
            "size KV pools. Set model.max_model_len.",
        )


def rule_bench(c: Checker) -> None:
    b = c.p.bench
    lens = [merged(c.p, g).max_model_len or c.p.model.max_model_len for _, g in c.groups()]
    lens = [x for x in lens if x]
    if lens and b.input_len + b.output_len > min(lens):
        c.warn(
            ("bench", "input_len"),
            f"input {b.input_len} + output {b.output_len} tokens "
            f"exceed max_model_len {min(lens)}; vLLM will reject these requests.",
        )


RULES = [
    rule_bench,
    rule_host_refs,
    rule_groups_present,
    rule_parallelism,
    rule_roles,
    rule_layerwise,
    rule_sparse,
    rule_memfabric,
    rule_memcache,
    rule_mooncake,
    rule_ucm,
    rule_consistency,
    rule_proxy,
    rule_ports,
    rule_model,
]
