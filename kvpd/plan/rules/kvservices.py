"""KV services: the memcache MetaService and LocalService files, Mooncake, UCM."""

from __future__ import annotations

from kvpd.plan.layout import hardware_of, host_devices
from kvpd.plan.rules.base import Checker
from kvpd.plan.sizing import GiB, parse_size
from kvpd.profile.schema import ASCEND


def rule_mooncake(c: Checker) -> None:  # noqa: C901 — a flat checklist: one independent check per Mooncake setting
    mk = c.p.kv.mooncake
    if mk is None:
        return
    path = ("kv", "mooncake")
    users = [
        (r, g) for r, g in c.groups() if {"mooncake", "mooncake_layerwise"} & set(g.kv_connectors)
    ]
    if (
        users
        and any(hardware_of(c.p, h) in ASCEND for _, g in users for h in g.hosts)
        and mk.protocol != "ascend"
    ):
        c.err(
            (*path, "protocol"),
            f"vLLM-Ascend accepts only protocol ascend, not {mk.protocol}. Set protocol: ascend.",
            on_hardware=True,
        )
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
                "number of GB; vLLM-Ascend documents 1 GB alignment. Round it to whole GB.",
            )
    except ValueError:
        c.err(
            (*path, "global_segment_size"),
            f"{mk.global_segment_size!r}: use a size with unit "
            "GB, MB, KB or B (e.g. 1GB); '1G' and '1GiB' are rejected by vLLM-Ascend.",
        )
    if not 0 < mk.eviction_ratio < 1:
        c.err((*path, "eviction_ratio"), "must be between 0 and 1 (exclusive); use e.g. 0.1.")
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
                    on_hardware=True,
                )
                break


def rule_ucm(c: Checker) -> None:  # noqa: C901 — a flat checklist: one independent check per UCM setting
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
        c.err(
            (*path, "enable_event_sync"),
            "must be false with UcmNfsStore. Set enable_event_sync: false.",
        )
    for key, use in UCM_MANAGED.items():
        if key in u.config:
            c.err(
                (*path, "config", key),
                f"{key} is written by kvpd; remove it from kv.ucm.config and set {use}.",
            )
    if u.config_file and u.config_file.startswith("/"):
        c.warn(
            (*path, "config_file"),
            f"kvpd writes the UCM yaml to {u.config_file} on every UCM host, outside its run "
            "directory, replacing whatever file is there (UCM ships its example config under "
            "examples/). Leave config_file unset to keep it in the run directory "
            "(conf/ucm.yaml), or point it at a path kvpd may own.",
        )
    _ucm_int(c, "data_dir_shard_bytes", 0, 5, "3 (4096 folders)")
    _ucm_int(c, "cache_stream_number", 1, 32, "a number from 1 to 32")
    engine = u.config.get("posix_io_engine")
    if engine is not None and engine not in ("psync", "aio"):
        c.err(
            (*path, "config", "posix_io_engine"),
            f"{engine!r} is not a UCM posix_io_engine; use psync or aio.",
        )
    users = [(r, g) for r, g in c.groups() if "ucm" in g.kv_connectors]
    for r, g in users:
        if g.pp > 1 and not u.use_layerwise:
            c.err(
                (*path, "use_layerwise"),
                f"{r} uses pp {g.pp}: UCM needs use_layerwise: true. Set it in kv.ucm.",
            )
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


UCM_MANAGED = {
    "ucm_connector_name": "kv.ucm.connector",
    "store_pipeline": "kv.ucm.pipeline",
    "storage_backends": "kv.ucm.storage",
    "cache_buffer_capacity_gb": "kv.ucm.cache_buffer_capacity_gb",
    "enable_event_sync": "kv.ucm.enable_event_sync",
    "use_layerwise": "kv.ucm.use_layerwise",
}


def _ucm_int(c: Checker, key: str, lo: int, hi: int, example: str) -> None:
    u = c.p.kv.ucm
    if u is None or key not in u.config:
        return
    v = u.config[key]
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        c.err(
            ("kv", "ucm", "config", key),
            f"{v!r} is not a whole number in [{lo}, {hi}], which UCM requires. Use {example}.",
        )


def rule_mooncake_parallel(c: Checker) -> None:
    """MooncakeConnectorV1 facts that concern the groups (vllm-ascend.md §4.2)."""
    for gf in c.gfacts():
        if not {"mooncake", "mooncake_layerwise"} & gf.connectors:
            continue
        g = gf.group
        if g.pp > 1 and g.cp > 1:
            c.err(
                (gf.role, "cp"),
                f"Mooncake does not support pipeline and context parallel together ({gf.role} "
                f"pp {g.pp}, cp {g.cp}). Set pp: 1 or cp: 1.",
            )
    mk = c.p.kv.mooncake
    if mk is None:
        return
    ms = mk.metadata_server
    if ms != "P2PHANDSHAKE" and not ms.startswith(("http://", "https://", "etcd://")):
        c.err(
            ("kv", "mooncake", "metadata_server"),
            f"{ms!r} is neither P2PHANDSHAKE nor an http(s):// or etcd:// URL. Use "
            "P2PHANDSHAKE (the guides' setting).",
        )
    if mk.protocol == "ascend" and mk.device_name:
        c.err(
            ("kv", "mooncake", "device_name"),
            f"device_name must be empty with the ascend protocol, not {mk.device_name!r}. "
            'Set device_name: "".',
        )


MASTER_FLAGS = {
    "--port": "kv.mooncake.port",
    "--metrics_port": "kv.mooncake.metrics_port",
    "--eviction_ratio": "kv.mooncake.eviction_ratio",
    "--eviction_high_watermark_ratio": "kv.mooncake.eviction_high_watermark_ratio",
    "--default_kv_lease_ttl": "kv.mooncake.default_kv_lease_ttl",
    "--enable_http_metadata_server": "kv.mooncake.http_metadata_port",
    "--http_metadata_server_port": "kv.mooncake.http_metadata_port",
}


def rule_mooncake_args(c: Checker) -> None:
    """`extra_args` of the master must not re-set the ports and values kvpd checks."""
    mk = c.p.kv.mooncake
    if mk is None:
        return
    for i, arg in enumerate(mk.extra_args):
        flag = arg.split("=", 1)[0]
        if flag in MASTER_FLAGS:
            c.err(
                ("kv", "mooncake", "extra_args", i),
                f"{flag} is set by kvpd (and checked in the port ledger); remove it and set "
                f"{MASTER_FLAGS[flag]} instead.",
            )


def rule_mooncake_timeouts(c: Checker) -> None:
    """The master's KV lease must outlive the transfer timeouts (kv-stores.md §5.3.4)."""
    mk = c.p.kv.mooncake
    if mk is None:
        return
    for gf in c.gfacts():
        if not {"mooncake", "mooncake_layerwise"} & gf.connectors:
            continue
        for name in ("ASCEND_CONNECT_TIMEOUT", "ASCEND_TRANSFER_TIMEOUT"):
            v = gf.env.get(name, "")
            if v.isdigit() and int(v) >= mk.default_kv_lease_ttl:
                c.err(
                    ("kv", "mooncake", "default_kv_lease_ttl"),
                    f"default_kv_lease_ttl {mk.default_kv_lease_ttl} ms is not above "
                    f"{name} {v} ms of {gf.role}: leases would expire mid-transfer. Raise "
                    f"default_kv_lease_ttl above {v}.",
                )
                return
