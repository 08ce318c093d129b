"""The cluster profile schema. Short for humans: defaults follow the two deployment guides.

Every model forbids unknown keys (the loader turns that into "did you mean ...") and is frozen.
Cross-field rules live in `kvpd.plan.rules`, not here, so that one profile can report all of its
problems at once, each with its field path and YAML line.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from kvpd.profile.base import _Model
from kvpd.profile.bench_schema import MAX_PROMPTS as MAX_PROMPTS
from kvpd.profile.bench_schema import Bench as Bench
from kvpd.profile.bench_schema import BenchScenario as BenchScenario
from kvpd.profile.bench_schema import BenchSweep as BenchSweep
from kvpd.profile.container_schema import Container

# The KV-service models live in kv_schema; re-exported so `kvpd.profile.schema` keeps every model.
from kvpd.profile.kv_schema import UCM as UCM
from kvpd.profile.kv_schema import KvComponent as KvComponent
from kvpd.profile.kv_schema import KvpdStore as KvpdStore
from kvpd.profile.kv_schema import KvServices
from kvpd.profile.kv_schema import Memcache as Memcache
from kvpd.profile.kv_schema import Memfabric as Memfabric
from kvpd.profile.kv_schema import Mooncake as Mooncake
from kvpd.profile.proxy_schema import ProxyRouting
from kvpd.profile.rehearsal_schema import Rehearsal as Rehearsal
from kvpd.profile.roles import Role
from kvpd.profile.types import (
    Address,
    ClientKeyFile,
    Command,
    Env,
    HostList,
    HostName,
    HumanInt,
    JsonData,
    Jump,
    Line,
    NicName,
    RunDir,
    Text,
    TransportKind,
)

Hardware = Literal["a2", "a3", "950", "cuda", "cpu"]
ASCEND = ("a2", "a3", "950")
# Devices per host when a host does not say: Atlas 800 A2 has 8 NPUs, A3 16 dies, 950 8.
DEFAULT_DEVICES = {"a2": 8, "a3": 16, "950": 8, "cuda": 8, "cpu": 2}


class SSH(_Model):
    """How to log in. Set once at the top level; a host may override any field."""

    user: str | None = Field(
        None, pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$", description="login user (default: yours)"
    )
    port: int = Field(22, ge=1, le=65535)
    key: Line | None = Field(None, description="private key file (default: agent and ~/.ssh keys)")
    known_hosts: Line | None = Field(
        None, description="known_hosts file used to verify host keys (default ~/.ssh/known_hosts)"
    )
    jump: Jump | None = Field(
        None,
        description="bastion(s) as user@host:port[,...] (like ProxyJump); its own user and port "
        "are written here, else ~/.ssh/config's for that host, else this section's user",
    )
    jump_key: Line | None = Field(
        None,
        description="private key for the jump host(s) (default: ~/.ssh/config's IdentityFile "
        "for the bastion, else `key`, else agent and ~/.ssh keys)",
    )


class Host(_Model):
    address: Address = Field(
        description="node IP (or host name) the others reach it at; also where kvpd connects"
    )
    ip: Address | None = Field(
        None,
        description="numeric IP for HCCL_IF_IP / VLLM_HOST_IP when `address` is a host "
        "name (kvpd does not resolve names while planning)",
    )
    transport: TransportKind | None = Field(
        None, description="'local' runs on this machine without SSH (default: local for 127.0.0.1)"
    )
    ssh: SSH | None = None
    nic: NicName | None = Field(None, description="NIC name of `address` (HCCL/GLOO/TP IFNAME)")
    hardware: Hardware | None = Field(None, description="default: the profile's `hardware`")
    devices: int | None = Field(
        None,
        ge=0,
        le=1024,
        description="devices on this host as the hardware counts them: a2 and 950 NPU chips "
        "(8 a server), a3 dies (2 per chip, 16 a server, as npu-smi lists them), cuda GPUs, "
        "cpu cores",
    )
    device_memory_gb: float | None = Field(
        None,
        gt=0,
        le=4096,
        description="HBM of one device as counted by `devices` (default: the hardware's, "
        "e.g. 64 GB per A3 die)",
    )
    memory_gb: float | None = Field(None, gt=0, description="host DRAM, for pool sizing checks")
    run_dir: RunDir | None = Field(None, description="where kvpd writes files and logs on the host")
    container: Container | None = Field(
        None, description="run this host's processes inside a container (docs: cluster/containers)"
    )
    bundle_builder: bool = Field(
        False, description="its node wheel build serves all hosts of its platform (else itself)"
    )


class ModelSpec(_Model):
    """The served model and the facts sizing needs (overridable; normally from config.json)."""

    path: Command
    config: Text | None = Field(
        None,
        description="config.json (or model dir) to read the facts below from; "
        "facts written here take precedence",
    )
    served_name: Text | None = None
    tokenizer: Text | None = Field(None, description="tokenizer path for bench (default: path)")
    attention: Literal["mha", "gqa", "mla", "sfa", "dsa"] = Field(
        "gqa",
        description="mha/gqa: K and V per KV head; mla: dense latent attention (DeepSeek-V3, "
        "Kimi-K2); sfa: latent attention with a sparse indexer (DeepSeek-V3.2, GLM-5; "
        "vLLM-Ascend's SFA backend); dsa: the model-side name of sfa, planned the same",
    )
    heads: int | None = Field(
        None, ge=1, description="attention (query) heads, num_attention_heads of config.json"
    )
    weights_gb: float | None = Field(
        None,
        gt=0,
        description="size of the weights in GB as loaded (default: the *.safetensors files "
        "next to `config` when that is a local model dir; else unchecked)",
    )
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


class RestartPolicy(_Model):
    """What the node-side supervisor does when the process exits (kvpd/supervisor.py)."""

    policy: Literal["never", "on-failure"] = Field(
        "never", description="on-failure: restart after a non-zero exit or a signal"
    )
    max_restarts: int = Field(3, ge=1, le=10, description="give up after this many in window_s")
    window_s: float = Field(600.0, gt=0, le=86400, description="seconds the restarts count in")
    backoff_s: float = Field(
        2.0, ge=0, le=600, description="wait before the first restart; doubles, at most 60 s"
    )


class ServeOptions(_Model):
    """`vllm serve` options. Set under `engine:` for all groups; a group overrides."""

    host: Address | None = Field(None, description="bind address (default 0.0.0.0)")
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    seed: int | None = None
    max_model_len: int | None = Field(None, ge=1)
    max_num_batched_tokens: int | None = Field(None, ge=1)
    max_num_seqs: int | None = Field(None, ge=1)
    trust_remote_code: bool | None = None
    enforce_eager: bool | None = None
    enable_expert_parallel: bool | None = None
    quantization: Text | None = None
    block_size: int | None = Field(None, ge=1, description="--block-size (default: vLLM's)")
    enable_prefix_caching: bool | None = None
    enable_chunked_prefill: bool | None = None
    compilation_config: JsonData | None = None
    additional_config: JsonData | None = None
    kv_cache_memory_bytes: HumanInt | None = None
    args: list[str] | None = Field(None, description="extra `vllm serve` arguments, verbatim")
    env: Env | None = None


class Group(ServeOptions):
    """Engines of one role: `instances` independent engines, each DP x TP."""

    hosts: HostList
    instances: int = Field(1, ge=1, le=4096)
    dp: int = Field(1, ge=1, le=65536)
    tp: int = Field(1, ge=1, le=1024)
    pp: int = Field(1, ge=1, le=1024)
    cp: int = Field(1, ge=1, le=64, description="context parallel size (prefill x decode CP)")
    dp_size_local: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="DP ranks of one instance per host (default: as many as fit the first "
        "host; `placement: spread` spreads them over the hosts)",
    )
    placement: Literal["pack", "spread"] = Field(
        "pack",
        description="pack: fill each listed host before the next (the guides' layouts); "
        "spread: put each instance (and DP chunk) on the least-used listed host",
    )
    allow_idle_hosts: bool = Field(
        False, description="accept listed hosts the layout leaves without an engine"
    )
    dp_launch: Literal["auto", "single", "per_rank"] = Field(
        "auto", description="one `vllm serve` per instance or one per DP rank (external LB)"
    )
    dp_address: HostName | None = Field(None, description="DP master host (default: first host)")
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
    log_name: Line | None = Field(
        None,
        description="name of each engine's log file in the run dir's logs/, like the guide's "
        "prefiller_dp_{dp_rank}.log (placeholders {name} {role} {host} {instance} {dp_rank})",
    )
    health_timeout_s: float | None = Field(
        None,
        gt=0,
        description="how long `up` waits for this group's engines to become healthy (default: "
        "runtime.health_timeout_s, plus time to set up a sparse-offload host pool)",
    )
    restart: RestartPolicy | None = Field(
        None, description="supervise and restart this group's engines (default: never)"
    )
    container: Container | None = Field(
        None, description="container for every host of this group (a host's own wins)"
    )

    @field_validator("kv_connectors", mode="before")
    @classmethod
    def _one_or_many(cls, v: Any) -> Any:
        if isinstance(v, str):
            return [s.strip() for s in v.split("+")]
        return v


class Proxy(ProxyRouting):
    host: HostName = Field(description="host that runs the proxy")
    port: int = Field(8000, ge=1, le=65535)
    bind: Address | None = Field(None, description="listen address (default: the host's address)")
    flow: Literal["auto", "prefill-first", "layerwise"] = "auto"
    impl: Literal["kvpd", "vllm-ascend"] = Field("kvpd", description="kvpd's or vLLM-Ascend's")
    client_key_file: ClientKeyFile = None
    script: Line | None = Field(None, description="path of the vLLM-Ascend example proxy")
    python: Command = "python"
    # kvpd's proxy only; unset: no limit for prefill and first byte, as upstream (128k: minutes)
    prefill_timeout_s: float | None = Field(
        None, gt=0, description="longest wait for a prefiller's answer (unset: no limit)"
    )
    first_byte_timeout_s: float | None = Field(
        None, gt=0, description="longest wait for a decoder's first byte (unset: no limit)"
    )
    read_timeout_s: float | None = Field(
        None, gt=0, description="longest silence between a decoder's stream chunks (unset: 300)"
    )
    connect_timeout_s: float | None = Field(
        None, gt=0, description="longest wait for a backend connection (unset: 3)"
    )
    restart: RestartPolicy | None = Field(
        None, description="supervise and restart the proxy (default: never)"
    )


class Runtime(_Model):
    vllm: Command = Field("vllm", description="the vLLM command on the hosts")
    python: Command = Field("python3", description="python on the hosts (proxy, services)")
    kvpd: Command = Field("kvpd", description="the kvpd command on the proxy host")
    run_dir: RunDir | None = Field(None, description="default run dir on every host")
    dirs: list[Line] = Field(
        default_factory=list, description="directories created in the run dir before launch"
    )
    fresh_dirs: list[Line] = Field(
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
    lease_s: int = Field(
        60,
        ge=3,
        le=3600,
        description="time to live of the deployment's lease while `up`, `down` or `restart` "
        "runs (renewed every third of it; a killed kvpd's lease expires after it)",
    )


class Profile(_Model):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=64)
    description: str = ""
    hardware: Hardware = "a3"
    ssh: SSH = Field(default_factory=lambda: SSH.model_validate({}))
    hosts: dict[HostName, Host] = Field(min_length=1)
    model: ModelSpec
    env: Env = Field(default_factory=dict, description="env of every process")
    runtime: Runtime = Field(default_factory=lambda: Runtime.model_validate({}))
    kv: KvServices = Field(default_factory=lambda: KvServices.model_validate({}))
    engine: ServeOptions = Field(default_factory=lambda: ServeOptions.model_validate({}))
    prefill: Group | None = None
    decode: Group | None = None
    mixed: Group | None = None
    proxy: Proxy | None = None
    bench: Bench = Field(default_factory=lambda: Bench.model_validate({}))
    rehearsal: Rehearsal = Field(default_factory=lambda: Rehearsal.model_validate({}))

    def group(self, role: str) -> Group | None:
        """The engine group that plays `role`; None for an absent group or for a role that is
        not an engine's (the proxy, the KV services)."""
        if role == Role.PREFILL:
            return self.prefill
        if role == Role.DECODE:
            return self.decode
        if role == Role.MIXED:
            return self.mixed
        return None

    def engine_group(self, role: str) -> Group:
        """The group of an engine process's `role`: the plan only places engines of groups the
        profile has, so an absent one is a bug, not a profile error."""
        group = self.group(role)
        assert group is not None, f"no {role} group for an engine process"
        return group
