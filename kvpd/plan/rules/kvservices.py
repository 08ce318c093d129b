"""KV services: the memcache MetaService and LocalService files, Mooncake, UCM."""

from __future__ import annotations

from kvpd.plan.layout import hardware_of, host_devices
from kvpd.plan.rules.base import Checker
from kvpd.plan.sizing import GiB, parse_size
from kvpd.profile.schema import ASCEND

MEMCACHE_PROTOCOLS = {
    "a2": ("device_rdma", "host_rdma", "host_tcp"),
    "a3": ("device_sdma", "host_rdma", "host_tcp"),
    "950": ("device_urma", "device_uboe", "host_urma", "host_tcp"),
    "cpu": ("host_tcp", "host_shm"),
    "cuda": ("host_rdma", "host_tcp"),
}


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
    ranks = c.f.memcache_ranks
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
