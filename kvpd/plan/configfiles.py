"""Config files built as data and serialized (pure): memcache INI, UCM YAML, mooncake.json.

No profile value is ever pasted into config text: the memcache files go through an INI writer
that refuses what `key = value` lines cannot carry, the UCM file through `yaml.safe_dump` and
mooncake.json through `json.dumps`. Templates are used only for the launch scripts.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import yaml

from kvpd.plan.memcache_compat import has_http
from kvpd.profile.kv_schema import UCM, Memcache

HCOM_PROTOCOLS = ("host_rdma", "host_urma", "host_tcp")  # libhcom transports (not host_shm)


def ini_text(comments: Iterable[str], items: Iterable[tuple[str, str]]) -> str:
    """`key = value` lines as memcache reads them. Raises ValueError on what they cannot hold
    (the schema refuses such values first, with their line; this is the last guard)."""
    out = [f"# {c}" for c in comments]
    for key, value in items:
        if not key or any(ch in key for ch in "=#\n\r\x00 \t"):
            raise ValueError(f"config key {key!r} cannot be written as `key = value`")
        if any(ch in value for ch in "\n\r\x00"):
            raise ValueError(f"value of {key} cannot span lines")
        out.append(f"{key} = {value}")
    return "\n".join(out) + "\n"


def memcache_meta(mc: Memcache, meta_address: str, deployment: str) -> str:
    host = url_host(meta_address)
    items = [
        ("ock.mmc.meta_service_url", f"tcp://{host}:{mc.port}"),
        ("ock.mmc.meta_service.config_store_url", f"tcp://{host}:{mc.config_store_port}"),
        *(
            [("ock.mmc.meta_service.metrics_url", f"http://{host}:{mc.metrics_port}")]
            if has_http(mc)
            else []
        ),
        ("ock.mmc.meta.lease_ttl_ms", str(mc.lease_ttl_ms)),
        ("ock.mmc.log_level", mc.log_level),
        *mc.meta_extra.items(),
    ]
    comments = [
        f"memcache MetaService configuration for deployment {deployment}.",
        "Rendered by kvpd from the profile; edit the profile, not this file.",
    ]
    return ini_text(comments, items)


def memcache_local(
    mc: Memcache,
    meta_address: str,
    dram_size: str,
    deployment: str,
    host_name: str,
    local_address: str,
) -> str:
    host = url_host(meta_address)
    items = [
        ("ock.mmc.meta_service_url", f"tcp://{host}:{mc.port}"),
        ("ock.mmc.local_service.config_store_url", f"tcp://{host}:{mc.config_store_port}"),
        ("ock.mmc.log_level", mc.log_level),
        ("ock.mmc.local_service.world_size", str(mc.world_size)),
        ("ock.mmc.local_service.protocol", mc.protocol),
        ("ock.mmc.local_service.dram.size", dram_size),
    ]
    if mc.protocol in HCOM_PROTOCOLS and "ock.mmc.local_service.hcom_url" not in mc.local_extra:
        # host_* transports listen on the node's own NIC (default 127.0.0.1 would not be
        # reachable from the other nodes): this host's address, memcache's default port.
        items.append(("ock.mmc.local_service.hcom_url", f"tcp://{url_host(local_address)}:7000"))
    items += mc.local_extra.items()
    comments = [
        f"memcache LocalService configuration for deployment {deployment} (host {host_name}).",
        "Rendered by kvpd; both URLs are the MetaService's, as in mmc-meta.conf.",
    ]
    return ini_text(comments, items)


def ucm_yaml(ucm: UCM, deployment: str) -> str:
    config: dict[str, Any] = {
        "store_pipeline": ucm.pipeline,
        "storage_backends": ucm.storage,
        "cache_buffer_capacity_gb": ucm.cache_buffer_capacity_gb,
        **dict(sorted(ucm.config.items())),
    }
    doc = {
        "ucm_connectors": [{"ucm_connector_name": ucm.connector, "ucm_connector_config": config}],
        "enable_event_sync": ucm.enable_event_sync,
        "use_layerwise": ucm.use_layerwise,
    }
    body = yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, allow_unicode=True)
    return f"# UCM configuration for deployment {deployment}. Rendered by kvpd.\n{body}"


def mooncake_json(
    metadata_server: str, protocol: str, device_name: str, master: str, global_segment_size: str
) -> str:
    doc = {
        "metadata_server": metadata_server,
        "protocol": protocol,
        "device_name": device_name,
        "master_server_address": master,
        "global_segment_size": global_segment_size,
    }
    return json.dumps(doc, indent=4) + "\n"


def url_host(address: str) -> str:
    """An address as the host part of a URL (IPv6 in brackets)."""
    return f"[{address}]" if ":" in address else address
