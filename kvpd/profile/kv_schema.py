"""Profile models of the KV services kvpd starts or configures (memcache, Mooncake, UCM, ...)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from kvpd.profile.base import _Model
from kvpd.profile.types import Command, HostName, JsonData, Line, RelativeFile, Storage

KvComponent = Literal[
    "example",  # vLLM ExampleConnector over a shared folder (CPU tests)
    "nixl",  # vLLM NixlConnector (kv_buffer_device cpu on CPU hosts)
    "kvpd_store",  # kvpd's own tiered prefix-cache store connector
    "ucm",  # UCMConnector with a UCM yaml (UcmPipelineStore)
    "mooncake",  # vLLM-Ascend MooncakeConnectorV1 (P2P KV transfer, kv_port ranges)
    "mooncake_layerwise",  # vLLM-Ascend MooncakeLayerwiseConnector
    "sfa_d2h",  # vLLM-Ascend SfaRemoteD2HConnector (MemFabric; layerwise/sparse offload)
    "ascend_store",  # vLLM-Ascend AscendStoreConnector (memcache/mooncake KV pool)
]


class Memcache(_Model):
    """memcache_hybrid: one MetaService process and the LocalService config of every P rank."""

    host: HostName = Field(description="host that runs the MetaService")
    port: int = Field(5000, ge=1025, le=65535, description="meta RPC port")
    config_store_port: int = Field(6000, ge=1025, le=65535)
    metrics_port: int = Field(8000, ge=1025, le=65535)
    lease_ttl_ms: int = Field(30000, ge=1, le=2**31 - 1)
    log_level: Literal["debug", "info", "warn", "error"] = "error"
    version: Literal["1.2", "1.3"] = Field(
        "1.2",
        description="memcache-hybrid/memfabric-hybrid release installed (the guide's is 1.2); "
        "1.3 adds metrics_url and the MetaService's HTTP /health",
    )
    world_size: int = Field(256, ge=1, le=1024)
    protocol: Literal[
        "host_rdma",
        "host_urma",
        "host_tcp",
        "device_rdma",
        "device_urma",
        "device_uboe",
        "device_sdma",
        "host_shm",
    ] = "device_sdma"
    dram_size: str = Field(
        "auto",
        description="per-rank DRAM pool, e.g. 10GB; auto = KV bytes a token x max_model_len x "
        "the sequences the memcache users hold (instances x dp x max_num_seqs) / ranks",
    )
    sizing_seq_len: int | None = Field(None, ge=1, description="default: model.max_model_len")
    sizing_concurrency: int | None = Field(
        None,
        ge=1,
        description="sequences the pool holds at once (default: what the memcache users hold: "
        "instances x dp x max_num_seqs)",
    )
    set_env: list[Line] = Field(
        default_factory=lambda: [
            "/usr/local/memcache_hybrid/set_env.sh",
            "/usr/local/memfabric_hybrid/set_env.sh",
        ],
        description="scripts sourced before the MetaService and memcache clients",
    )
    meta_extra: dict[str, Line] = Field(
        default_factory=dict, description="more mmc-meta.conf keys (not the ones kvpd writes)"
    )
    local_extra: dict[str, Line] = Field(
        default_factory=dict, description="more mmc-local.conf keys (not the ones kvpd writes)"
    )
    python: Command = "python"


class Memfabric(_Model):
    extend_lib_path: Line | None = Field(
        "/usr/local/memfabric_hybrid/1.2.0/aarch64-linux/lib64",
        description="MEMFABRIC_HYBRID_EXTEND_LIB_PATH (null to leave unset)",
    )
    set_env: list[Line] = Field(default_factory=lambda: ["/usr/local/memfabric_hybrid/set_env.sh"])


class Mooncake(_Model):
    """The Mooncake master and the mooncake.json every node gets."""

    host: HostName
    port: int = Field(50088, ge=1, le=65535)
    metrics_port: int = Field(9003, ge=1, le=65535)
    http_metadata_port: int | None = Field(None, ge=1, le=65535)
    eviction_high_watermark_ratio: float = Field(0.9, gt=0, le=1)
    eviction_ratio: float = Field(0.1, gt=0, lt=1)
    default_kv_lease_ttl: int = Field(11000, ge=1)
    extra_args: list[Line] = Field(default_factory=list)
    metadata_server: Line = "P2PHANDSHAKE"
    protocol: Line = "ascend"
    device_name: str = Field("", pattern=r"^[A-Za-z0-9_.:,@-]*$")
    global_segment_size: Line = "1GB"
    ld_library_path: Line | None = "/usr/local/lib"
    binary: Command = "mooncake_master"


class UCM(_Model):
    """UCM PipelineStore ("Cache|Posix"): a persistent prefix cache on (shared) storage."""

    connector: Literal["UcmPipelineStore", "UcmNfsStore"] = "UcmPipelineStore"
    pipeline: str = "Cache|Posix"
    storage: Storage = Field(description="storage_backends: a directory every instance can reach")
    shared: bool | None = Field(
        None, description="the storage is one filesystem mounted on all hosts (NFS/3FS)"
    )
    cache_buffer_capacity_gb: int = Field(64, ge=1)
    enable_event_sync: bool = True
    use_layerwise: bool = False
    config: JsonData = Field(default_factory=dict, description="more ucm_connector_config")
    config_file: RelativeFile | None = Field(
        None, description="where the UCM yaml is written on each host (default: in the run dir)"
    )


class KvpdStore(_Model):
    """kvpd's own tiered store connector (`kvpd.connectors.store`)."""

    path: Line
    dram_cache_gb: float = Field(0.5, ge=0)
    capacity_gb: float | None = Field(None, gt=0)
    io_threads: int = Field(4, ge=1)


class KvServices(_Model):
    memcache: Memcache | None = None
    memfabric: Memfabric = Field(default_factory=lambda: Memfabric.model_validate({}))
    mooncake: Mooncake | None = None
    ucm: UCM | None = None
    example_path: str | None = Field(None, description="ExampleConnector shared_storage_path")
    kvpd_store: KvpdStore | None = None
