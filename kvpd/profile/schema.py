"""The cluster profile schema. Short for humans: defaults follow the two deployment guides.

Every model forbids unknown keys (the loader turns that into "did you mean ...") and is frozen.
Cross-field rules live in `kvpd.plan.rules`, not here, so that one profile can report all of its
problems at once, each with its field path and YAML line.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

Hardware = Literal["a2", "a3", "950", "cuda", "cpu"]
ASCEND = ("a2", "a3", "950")
# Devices per host when a host does not say: Atlas 800 A2 has 8 NPUs, A3 16 dies, 950 8.
DEFAULT_DEVICES = {"a2": 8, "a3": 16, "950": 8, "cuda": 8, "cpu": 2}

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


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @field_validator("hardware", mode="before", check_fields=False)
    @classmethod
    def _hardware_as_text(cls, v: Any) -> Any:
        return str(v) if isinstance(v, int) else v  # `hardware: 950` is an int in YAML


class SSH(_Model):
    """How to log in. Set once at the top level; a host may override any field."""

    user: str | None = Field(None, description="login user (default: the current user)")
    port: int = Field(22, ge=1, le=65535)
    key: str | None = Field(None, description="private key file (default: agent and ~/.ssh keys)")
    known_hosts: str | None = Field(
        None, description="known_hosts file used to verify host keys (default ~/.ssh/known_hosts)"
    )
    jump: str | None = Field(None, description="bastion as user@host:port (like ProxyJump)")


class Host(_Model):
    address: str = Field(description="node IP the others reach it at (also where kvpd connects)")
    transport: Literal["ssh", "local"] | None = Field(
        None, description="'local' runs on this machine without SSH (default: local for 127.0.0.1)"
    )
    ssh: SSH | None = None
    nic: str | None = Field(None, description="NIC name of `address` (HCCL/GLOO/TP socket IFNAME)")
    hardware: Hardware | None = Field(None, description="default: the profile's `hardware`")
    devices: int | None = Field(None, ge=0, description="NPUs/GPUs (cpu: cores) on this host")
    memory_gb: float | None = Field(None, gt=0, description="host DRAM, for pool sizing checks")
    run_dir: str | None = Field(None, description="where kvpd writes files and logs on the host")


class ModelSpec(_Model):
    """The served model and the facts sizing needs (overridable; normally from config.json)."""

    path: str
    config: str | None = Field(
        None,
        description="config.json (or model dir) to read the facts below from; "
        "facts written here take precedence",
    )
    served_name: str | None = None
    tokenizer: str | None = Field(None, description="tokenizer path for bench (default: path)")
    attention: Literal["mha", "gqa", "mla", "sfa", "dsa"] = "gqa"
    layers: int | None = Field(None, ge=1)
    kv_heads: int | None = Field(None, ge=1)
    head_dim: int | None = Field(None, ge=1)
    kv_lora_rank: int | None = Field(None, ge=1, description="MLA/SFA/DSA latent KV width")
    qk_rope_head_dim: int | None = Field(None, ge=1)
    index_topk: int | None = Field(None, ge=1, description="sparse-attention top-k (SFA/DSA)")
    compressed: bool = Field(False, description="DeepSeek-V4-style compress_ratios")
    dtype: Literal["bfloat16", "float16", "float32", "auto"] = "bfloat16"
    block_size: int = Field(128, ge=1)
    max_model_len: int | None = Field(None, ge=1)


class Memcache(_Model):
    """memcache_hybrid: one MetaService process and the LocalService config of every P rank."""

    host: str = Field(description="host that runs the MetaService")
    port: int = Field(5000, ge=1025, le=65535, description="meta RPC port")
    config_store_port: int = Field(6000, ge=1025, le=65535)
    metrics_port: int = Field(8000, ge=1025, le=65535)
    lease_ttl_ms: int = Field(30000, ge=1)
    log_level: Literal["debug", "info", "warn", "error"] = "error"
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
        "auto", description="per-rank DRAM pool, e.g. 10GB; auto = sized from the model facts"
    )
    sizing_seq_len: int | None = Field(None, description="default: model.max_model_len")
    sizing_concurrency: int | None = Field(None, description="default: bench concurrency")
    set_env: list[str] = Field(
        default_factory=lambda: [
            "/usr/local/memcache_hybrid/set_env.sh",
            "/usr/local/memfabric_hybrid/set_env.sh",
        ],
        description="scripts sourced before the MetaService and memcache clients",
    )
    meta_extra: dict[str, str] = Field(default_factory=dict, description="more mmc-meta.conf keys")
    local_extra: dict[str, str] = Field(default_factory=dict, description="more mmc-local keys")
    python: str = "python"


class Memfabric(_Model):
    extend_lib_path: str | None = Field(
        "/usr/local/memfabric_hybrid/1.2.0/aarch64-linux/lib64",
        description="MEMFABRIC_HYBRID_EXTEND_LIB_PATH (null to leave unset)",
    )
    set_env: list[str] = Field(default_factory=lambda: ["/usr/local/memfabric_hybrid/set_env.sh"])


class Mooncake(_Model):
    """The Mooncake master and the mooncake.json every node gets."""

    host: str
    port: int = Field(50088, ge=1, le=65535)
    metrics_port: int = Field(9003, ge=1, le=65535)
    http_metadata_port: int | None = Field(None, ge=1, le=65535)
    eviction_high_watermark_ratio: float = Field(0.9, gt=0, le=1)
    eviction_ratio: float = Field(0.1, gt=0, lt=1)
    default_kv_lease_ttl: int = Field(11000, ge=1)
    extra_args: list[str] = Field(default_factory=list)
    metadata_server: str = "P2PHANDSHAKE"
    protocol: str = "ascend"
    device_name: str = ""
    global_segment_size: str = "1GB"
    ld_library_path: str | None = "/usr/local/lib"
    binary: str = "mooncake_master"


class UCM(_Model):
    """UCM PipelineStore ("Cache|Posix"): a persistent prefix cache on (shared) storage."""

    connector: Literal["UcmPipelineStore", "UcmNfsStore"] = "UcmPipelineStore"
    pipeline: str = "Cache|Posix"
    storage: str = Field(description="storage_backends: a directory every instance can reach")
    shared: bool | None = Field(
        None, description="the storage is one filesystem mounted on all hosts (NFS/3FS)"
    )
    cache_buffer_capacity_gb: int = Field(64, ge=1)
    enable_event_sync: bool = True
    use_layerwise: bool = False
    config: dict[str, Any] = Field(default_factory=dict, description="more ucm_connector_config")
    config_file: str | None = Field(
        None, description="where the UCM yaml is written on each host (default: in the run dir)"
    )


class KvpdStore(_Model):
    """kvpd's own tiered store connector (`kvpd.connectors.store`)."""

    path: str
    dram_cache_gb: float = Field(0.5, ge=0)
    capacity_gb: float | None = Field(None, gt=0)
    io_threads: int = Field(4, ge=1)


class KvServices(_Model):
    memcache: Memcache | None = None
    memfabric: Memfabric = Field(default_factory=Memfabric)
    mooncake: Mooncake | None = None
    ucm: UCM | None = None
    example_path: str | None = Field(None, description="ExampleConnector shared_storage_path")
    kvpd_store: KvpdStore | None = None


class Layerwise(_Model):
    """AscendStoreConnector layerwise offload on Prefill (memcache backend)."""

    backend: Literal["memcache", "mooncake", "yuanrong"] = "memcache"
    use_layerwise: bool = True
    num_shared_buffers: int | None = Field(3, ge=1)
    independent_layers: list[int] | Literal["all"] = Field(default_factory=lambda: [0])
    prefetch_layers: int | None = Field(None, ge=1)

    @field_validator("independent_layers", mode="before")
    @classmethod
    def _all_case_insensitive(cls, v: Any) -> Any:
        return v.lower() if isinstance(v, str) else v


class SparseOffload(_Model):
    """Decode-side sparse KV offload (vLLM-Ascend `sparse_kv_offload_config`)."""

    enabled: bool = True
    topk_buffer_size: int = Field(4096, description="device hot-buffer token slots per row")
    dram_size_per_dp_gb: int = Field(128, ge=1)
    keep_device_kv_cache: bool = False
    planner: Literal["auto", "kvpd", "upstream"] = Field(
        "auto",
        description="host-side LRU planner: kvpd's prebuilt native core (vLLM plugin, no JIT "
        "build, 64-bit addresses), vLLM-Ascend's JIT-compiled one, or auto (kvpd when the "
        "bundle has the native core)",
    )


class ServeOptions(_Model):
    """`vllm serve` options. Set under `engine:` for all groups; a group overrides."""

    host: str | None = Field(None, description="bind address (default 0.0.0.0)")
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    seed: int | None = None
    max_model_len: int | None = Field(None, ge=1)
    max_num_batched_tokens: int | None = Field(None, ge=1)
    max_num_seqs: int | None = Field(None, ge=1)
    trust_remote_code: bool | None = None
    enforce_eager: bool | None = None
    enable_expert_parallel: bool | None = None
    quantization: str | None = None
    block_size: int | None = Field(None, ge=1, description="--block-size (default: vLLM's)")
    enable_prefix_caching: bool | None = None
    enable_chunked_prefill: bool | None = None
    compilation_config: dict[str, Any] | None = None
    additional_config: dict[str, Any] | None = None
    kv_cache_memory_bytes: str | None = None
    args: list[str] | None = Field(None, description="extra `vllm serve` arguments, verbatim")
    env: dict[str, str] | None = None


class Group(ServeOptions):
    """Engines of one role: `instances` independent engines, each DP x TP."""

    hosts: list[str] = Field(min_length=1)
    instances: int = Field(1, ge=1)
    dp: int = Field(1, ge=1)
    tp: int = Field(1, ge=1)
    pp: int = Field(1, ge=1)
    cp: int = Field(1, ge=1, description="context parallel size (prefill x decode CP)")
    dp_size_local: int | None = Field(None, ge=1, description="DP ranks per host")
    dp_launch: Literal["auto", "single", "per_rank"] = Field(
        "auto", description="one `vllm serve` per instance or one per DP rank (external LB)"
    )
    dp_address: str | None = Field(None, description="DP master host (default: first host)")
    dp_rpc_port: int = Field(13395, ge=1, le=65535)
    port: int = Field(8000, ge=1, le=65535, description="HTTP port; +1 per process on a host")
    kv_port: int | None = Field(None, ge=1, le=65535)
    kv_connectors: list[KvComponent] = Field(default_factory=list)
    kv_role: Literal["kv_producer", "kv_consumer", "kv_both"] | None = None
    layerwise: Layerwise | None = None
    sparse_offload: SparseOffload | None = None
    memfabric_protocol: Literal["sdma", "device_rdma", "device_urma"] | None = None
    model_runner_v2: bool = False
    sfa_c8: bool = False
    log_name: str | None = Field(
        None, description="tee the engine log like the guide, e.g. prefiller_dp_{dp_rank}.log"
    )

    @field_validator("kv_connectors", mode="before")
    @classmethod
    def _one_or_many(cls, v: Any) -> Any:
        if isinstance(v, str):
            return [s.strip() for s in v.split("+")]
        return v


class Proxy(_Model):
    host: str = Field(description="host that runs the proxy")
    port: int = Field(8000, ge=1, le=65535)
    bind: str | None = Field(None, description="listen address (default: the host's address)")
    flow: Literal["auto", "prefill-first", "layerwise"] = "auto"
    impl: Literal["kvpd", "vllm-ascend"] = Field(
        "kvpd", description="kvpd's proxy or vLLM-Ascend's example proxy script"
    )
    script: str | None = Field(None, description="path of the vLLM-Ascend example proxy")
    python: str = "python"


class BenchSweep(_Model):
    """Lists `kvpd bench` sweeps over (cross product); empty: the single value of `bench`."""

    input_len: list[int] = Field(default_factory=list)
    output_len: list[int] = Field(default_factory=list)
    max_concurrency: list[int] = Field(default_factory=list)


class Bench(_Model):
    """Defaults of `kvpd bench` (the guides' `vllm bench serve` protocol)."""

    input_len: int = Field(1024, ge=1)
    output_len: int = Field(128, ge=1)
    num_prompts: int = Field(10, ge=1)
    request_rate: float | Literal["inf"] = "inf"
    max_concurrency: int | None = Field(None, ge=1)
    seed: int = 123456
    ignore_eos: bool = True
    prefix_ratio: float = Field(0.8, gt=0, lt=1)
    protocol: Literal["plain", "prefix", "twice"] = "plain"
    sweep: BenchSweep | None = None
    scenarios: dict[str, list[str]] = Field(
        default_factory=dict,
        description="name -> `--set` overrides; `kvpd bench --scenario NAME` restarts the "
        "deployment with them. Names starting with external/ucm must show external cache hits.",
    )


class Rehearsal(_Model):
    """How `--rehearse` runs this topology on CPU hosts (usually given in an inventory file).

    Engines become CPU `vllm serve`s of a tiny model, Ascend-only KV connectors become
    ExampleConnector over a shared folder; the memcache MetaService and the Mooncake master run
    for real from a Python environment that has memcache-hybrid / mooncake installed.
    """

    model: str = Field(".kvpd/models/tiny", description="tiny model dir, same path on all hosts")
    vllm: str = Field("vllm", description="CPU vLLM command on the hosts")
    kvpd: str = Field("kvpd", description="kvpd command on the proxy host")
    python: str = Field("python3", description="python with memcache-hybrid installed")
    mooncake_master: str = Field("mooncake_master", description="mooncake_master command")
    storage: str = Field(".kvpd/rehearsal/kv", description="shared folder for KV hand-over")
    cores: int = Field(2, ge=1, description="CPU cores to spread the engines over")
    health_timeout_s: float = Field(600, gt=0)


class Runtime(_Model):
    vllm: str = Field("vllm", description="the vLLM command on the hosts")
    python: str = Field("python3", description="python on the hosts (proxy, services)")
    kvpd: str = Field("kvpd", description="the kvpd command on the proxy host")
    run_dir: str | None = Field(None, description="default run dir on every host")
    dirs: list[str] = Field(
        default_factory=list, description="directories created in the run dir before launch"
    )
    fresh_dirs: list[str] = Field(
        default_factory=list,
        description="scratch directories in the run dir, emptied by every `kvpd up` "
        "(e.g. a local KV hand-over folder)",
    )

    @field_validator("dirs", "fresh_dirs")
    @classmethod
    def _inside_run_dir(cls, v: list[str]) -> list[str]:
        for d in v:
            if d.startswith(("/", "~")) or ".." in d.split("/") or not d.strip("/."):
                raise ValueError(f"{d!r} must be a relative path inside the run directory")
        return v

    health_timeout_s: float = Field(1800, gt=0)


class Profile(_Model):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    description: str = ""
    hardware: Hardware = "a3"
    ssh: SSH = Field(default_factory=SSH)
    hosts: dict[str, Host] = Field(min_length=1)
    model: ModelSpec
    env: dict[str, str] = Field(default_factory=dict, description="env of every process")
    runtime: Runtime = Field(default_factory=Runtime)
    kv: KvServices = Field(default_factory=KvServices)
    engine: ServeOptions = Field(default_factory=ServeOptions)
    prefill: Group | None = None
    decode: Group | None = None
    mixed: Group | None = None
    proxy: Proxy | None = None
    bench: Bench = Field(default_factory=Bench)
    rehearsal: Rehearsal = Field(default_factory=Rehearsal)
