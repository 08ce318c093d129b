"""memcache_hybrid: the MetaService and LocalService files (kv-stores.md §1.3, §1.4, §5.1).

memcache refuses unknown and repeated keys at start, so the pass-through maps `meta_extra` and
`local_extra` may hold only known keys of their own file, never a key kvpd writes itself.
"""

from __future__ import annotations

import difflib

from kvpd.plan.capacity import memcache_dram_need
from kvpd.plan.layout import hardware_of
from kvpd.plan.rules.base import Checker
from kvpd.plan.sizing import GiB, parse_size
from kvpd.profile.types import is_loopback

MEMCACHE_PROTOCOLS = {
    "a2": ("device_rdma", "host_rdma", "host_tcp"),
    "a3": ("device_sdma", "host_rdma", "host_tcp"),
    "950": ("device_urma", "device_uboe", "host_urma", "host_tcp"),
    "cpu": ("host_tcp", "host_shm"),
    "cuda": ("host_rdma", "host_tcp"),
}
_TLS = ("enable", "ca.path", "ca.crl.path", "cert.path", "key.path", "key.pass.path")
_TLS_ALL = (*_TLS, "package.path", "decrypter.path")
_LOG = ("log_path", "log_rotation_file_size", "log_rotation_file_count", "log_output_target")
_BOTH = {f"ock.mmc.{k}" for k in _LOG} | {
    f"ock.mmc.{p}.{t}" for p in ("tls", "config_store.tls") for t in _TLS_ALL
}
META_KEYS = _BOTH | {
    f"ock.mmc.{k}"
    for k in (
        "meta.ha.enable",
        "meta.backup.enable",
        "meta_service.metrics_report_interval_seconds",
        "meta_service.lru_shard_count",
        "meta_service.lru_type",
        "meta_service.storage.metadata_mode",
        "meta_service.alloc.max_value_mode.enabled",
        "evict_threshold_high",
        "evict_threshold_low",
        "defrag_evict_threshold",
        "evict_check_interval_seconds",
        "evict_yield_interval",
        "evict_yield_duration_us",
        "rewarm.dram_watermark",
        "storage.prefetch.enabled",
        "storage.async_flush.batch_limit",
        "storage.async_flush.interval_ms",
        "storage.pending_wait.timeout",
        "zmq.enable_curve",
        "zmq.public_key",
        "zmq.private_key",
        *(f"kv_events.{k}" for k in ("enable", "endpoint", "model_name", "tenant_id")),
        *(f"kv_events.{k}" for k in ("block_size", "queue_capacity", "hash_as_int", "transport")),
        *(f"metrics.tls.{t}" for t in _TLS_ALL),
    )
}
LOCAL_KEYS = (
    _BOTH
    | {
        f"ock.mmc.{k}"
        for k in (
            "local_service.config_store_url_domain",
            "local_service.hcom_url",
            "local_service.hbm.size",
            "local_service.max.dram.size",
            "local_service.max.hbm.size",
            "local_service.memory.pool.mode",
            "local_service.storage.enabled",
            "local_service.dram.best_effort.enabled",
            "local_service.backend_id",
            "local_service.tag",
            "local_service.tag_op_info",
            "client.retry_milliseconds",
            "client.timeout.seconds",
            "client.read_thread_pool.size",
            "client.write_thread_pool.size",
            "client.aggregate.io",
            "client.aggregate.num",
            "client.batch_option.chunk.size",
            "client.batch_option.chunk.count",
            "dynamic_config.enable",
            "dynamic_config.interval",
            *(f"local_service.hcom.tls.{t}" for t in (*_TLS, "decrypter.path")),
        )
    }
    | {
        "ubsio.disk.path",
        "ubsio.mem.size_in_gb",
        "ubsio.standalone.device_count",
        "ubsio.standalone.force_new_disk",
        "ubsio.wcache.evict_water_level",
    }
)
# Keys kvpd writes itself -> the profile field that sets them.
MANAGED = {
    "ock.mmc.meta_service_url": "kv.memcache.host and kv.memcache.port",
    "ock.mmc.meta_service.config_store_url": "kv.memcache.config_store_port",
    "ock.mmc.local_service.config_store_url": "kv.memcache.config_store_port",
    "ock.mmc.meta_service.metrics_url": "kv.memcache.metrics_port",
    "ock.mmc.meta.lease_ttl_ms": "kv.memcache.lease_ttl_ms",
    "ock.mmc.log_level": "kv.memcache.log_level",
    "ock.mmc.local_service.world_size": "kv.memcache.world_size",
    "ock.mmc.local_service.protocol": "kv.memcache.protocol",
    "ock.mmc.local_service.dram.size": "kv.memcache.dram_size",
}


def _extra_keys(
    c: Checker, field: str, extra: dict[str, str], own: set[str], other: set[str]
) -> None:
    path = ("kv", "memcache", field)
    file = "mmc-meta.conf" if field == "meta_extra" else "mmc-local.conf"
    for key in extra:
        tidy = key.strip().lower()
        if tidy != key and (tidy in MANAGED or tidy in own or tidy in other):
            # memcache keys are exact: a near-spelling is an unknown key at start, and where it
            # is one kvpd writes it also reads as an attempt to set that key twice
            fix = (
                f"kvpd writes that key: remove it and set {MANAGED[tidy]} instead."
                if tidy in MANAGED
                else f"memcache keys are exact: write it as {tidy!r}."
            )
            c.err((*path, key), f"{key!r} is {tidy!r} in other case or with spaces; {fix}")
        elif key in MANAGED:
            c.err(
                (*path, key),
                f"{key} is written by kvpd (a second value would make memcache refuse "
                f"{file}); remove it and set {MANAGED[key]} instead.",
            )
        elif key in own:
            continue
        elif key in other:
            twin = "local_extra" if field == "meta_extra" else "meta_extra"
            c.err(
                (*path, key),
                f"{key} belongs in the other memcache file, not {file}; move it to "
                f"kv.memcache.{twin}.",
            )
        else:
            close = difflib.get_close_matches(key, sorted(own), n=1, cutoff=0.75)
            hint = f"Did you mean '{close[0]}'? " if close else ""
            c.err(
                (*path, key),
                f"{key} is not a memcache 1.3 key of {file} (memcache refuses unknown keys "
                f"at start). {hint}Remove it or fix its spelling.",
            )


def _int(v: str | None) -> int | None:
    return int(v) if v is not None and v.strip().isdigit() else None


def _extra_values(c: Checker) -> None:  # noqa: C901 — a flat checklist: one independent check per extra key
    mc = c.p.kv.memcache
    assert mc is not None
    meta, local = mc.meta_extra, mc.local_extra
    path = ("kv", "memcache")
    hi_s, lo_s = meta.get("ock.mmc.evict_threshold_high"), meta.get("ock.mmc.evict_threshold_low")
    # One given: the other is memcache's default (high 90, low 80), which it is checked against.
    hi = _int(hi_s) if hi_s is not None else (90 if lo_s is not None else None)
    lo = _int(lo_s) if lo_s is not None else (80 if hi_s is not None else None)
    if hi is not None and lo is not None and not 1 <= lo < hi <= 99:
        key = "high" if hi_s is not None else "low"
        c.err(
            (*path, "meta_extra", f"ock.mmc.evict_threshold_{key}"),
            f"evict thresholds low {lo}{'' if lo_s is not None else ' (the default)'} / high "
            f"{hi}{'' if hi_s is not None else ' (the default)'}: memcache needs 1 <= low < "
            "high <= 99 (it refuses to start otherwise). Raise high above low (e.g. 90 / 80).",
        )
    shards = meta.get("ock.mmc.meta_service.lru_shard_count")
    n = _int(shards)
    if shards is not None and (n is None or not 1 <= n <= 1024 or n & (n - 1)):
        c.err(
            (*path, "meta_extra", "ock.mmc.meta_service.lru_shard_count"),
            f"{shards!r} is not a power of two in [1, 1024]; use e.g. 16.",
        )
    max_dram = local.get("ock.mmc.local_service.max.dram.size")
    if max_dram is not None and mc.dram_size != "auto":
        try:
            if parse_size(max_dram) < parse_size(mc.dram_size):
                c.err(
                    (*path, "local_extra", "ock.mmc.local_service.max.dram.size"),
                    f"max.dram.size {max_dram} is smaller than dram_size {mc.dram_size}; "
                    "memcache refuses that. Set it to at least dram_size.",
                )
        except ValueError:
            pass
    if local.get("ock.mmc.local_service.storage.enabled", "").lower() == "true":
        if not local.get("ubsio.disk.path"):
            c.err(
                (*path, "local_extra", "ock.mmc.local_service.storage.enabled"),
                "the SSD tier needs its devices: add ubsio.disk.path (colon-separated, "
                "dedicated unmounted block devices) to local_extra.",
            )
        mem = _int(local.get("ubsio.mem.size_in_gb", "10"))
        if mem is None or not 5 <= mem <= 3072:
            c.err(
                (*path, "local_extra", "ubsio.mem.size_in_gb"),
                "with the SSD tier ubsio.mem.size_in_gb must be a whole number in [5, 3072]; "
                "use 50 (recommended).",
            )
    if mc.protocol == "host_shm":
        hbm = local.get("ock.mmc.local_service.hbm.size", "0")
        try:
            hbm_zero = parse_size(hbm) == 0
        except ValueError:
            hbm_zero = False
        if not hbm_zero:
            c.err(
                (*path, "local_extra", "ock.mmc.local_service.hbm.size"),
                "host_shm keeps everything in host memory: hbm.size must be 0. Remove it.",
            )
        hosts = {h for gf in c.gfacts() if "ascend_store" in gf.connectors for h in gf.group.hosts}
        if len(hosts) > 1:
            c.err(
                (*path, "protocol"),
                f"host_shm works within one node, but memcache users run on {len(hosts)} "
                "hosts. Use host_tcp (or the hardware's device protocol).",
            )


def rule_memcache(c: Checker) -> None:  # noqa: C901 — a flat checklist: one independent check per memcache setting
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
        shown = ", ".join(f"{k} {v}" for k, v in ports.items())
        c.err(
            path,
            f"meta rpc, config store and metrics ports must differ ({shown}). "
            "Give each its own port.",
        )
    ranks = c.f.memcache_ranks
    if ranks > mc.world_size:
        c.err(
            (*path, "world_size"),
            f"world_size {mc.world_size} is below the {ranks} "
            "LocalService ranks that will join (every TP x DP rank of the memcache users). "
            f"Use at least {ranks}.",
        )
    if mc.host in c.p.hosts:
        hw = hardware_of(c.p, mc.host)
        users = [h for r, g in c.groups() if "ascend_store" in g.kv_connectors for h in g.hosts]
        hws = {hardware_of(c.p, h) for h in users} or {hw}
        for hwu in sorted(hws):
            ok = MEMCACHE_PROTOCOLS.get(hwu, ())
            if mc.protocol not in ok:
                c.err(
                    (*path, "protocol"),
                    f"protocol {mc.protocol} does not match {hwu} hardware "
                    f"(use {' or '.join(ok)}).",
                    on_hardware=True,
                )
    if mc.dram_size != "auto":
        try:
            size = parse_size(mc.dram_size)
        except ValueError as e:
            c.err((*path, "dram_size"), f"{e}.")
        else:
            if size > 1 << 40:
                c.warn(
                    (*path, "dram_size"),
                    f"{mc.dram_size} per rank is above memcache's documented maximum of 1TB. "
                    "Use at most 1TB.",
                )
            need = memcache_dram_need(c.p, ranks)
            if need is not None and size < need:
                c.warn(
                    (*path, "dram_size"),
                    f"{mc.dram_size} per rank is below the guide's sizing ({need // GiB}GB: "
                    "the KV cache of max_model_len x the sequences the engines hold over the "
                    f"{max(1, ranks)} memcache ranks); prefixes will be evicted early. Use "
                    f"{need // GiB}GB or `auto`.",
                )
    meta_host = c.p.hosts.get(mc.host)
    clients = {h for gf in c.gfacts() if "ascend_store" in gf.connectors for h in gf.group.hosts}
    remote = [
        h for h in clients - {mc.host} if h in c.p.hosts and not is_loopback(c.p.hosts[h].address)
    ]
    if meta_host is not None and is_loopback(meta_host.address) and remote:
        c.err(
            (*path, "host"),
            f"the MetaService host '{mc.host}' has the loopback address {meta_host.address}, "
            "but memcache clients on other hosts must reach it. Give the host its network "
            "address.",
        )
    _extra_keys(c, "meta_extra", dict(mc.meta_extra), META_KEYS, LOCAL_KEYS)
    _extra_keys(c, "local_extra", dict(mc.local_extra), LOCAL_KEYS, META_KEYS)
    _extra_values(c)
