"""The plan: a frozen, JSON-serialisable value that `kvpd plan` shows and `kvpd up` executes.

Nothing here touches a host. Paths in a plan are relative to the host's run directory
(`HostSpec.run_dir`) unless they are absolute; the executor starts every process with that
directory as its working directory, so rendered files can refer to each other relatively.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from kvpd.plan.bench import BenchSpec, default_bench
from kvpd.plan.bundle import BundleUse
from kvpd.plan.container import ContainerSpec
from kvpd.profile.roles import Role
from kvpd.profile.schema import Hardware
from kvpd.profile.types import TransportKind


@dataclass(frozen=True)
class HostSpec:
    """A machine of the deployment and how to reach it."""

    name: str
    address: str  # where kvpd connects and where peers reach it (node IP)
    transport: TransportKind = "ssh"
    user: str | None = None
    port: int = 22
    key: str | None = None
    known_hosts: str | None = None
    jump: str | None = None  # ProxyJump spec "user@host:port"
    jump_key: str | None = None  # key for the jump host(s); unset: ssh_config's, else `key`
    hardware: Hardware = "cpu"
    devices: int = 0
    nic: str | None = None
    run_dir: str = ".kvpd/run"  # relative: to the login dir (ssh) or kvpd's cwd (local)
    # Containers: this host's processes run inside it (kvpd.plan.container).
    container: ContainerSpec | None = None
    # Its build of kvpd's node wheel may serve the other hosts of its platform (else only itself)
    bundle_builder: bool = False

    @staticmethod
    def from_dict(d: dict[str, Any]) -> HostSpec:
        d = dict(d)
        c = d.pop("container", None)
        return HostSpec(**d, container=ContainerSpec.from_dict(c) if c else None)


@dataclass(frozen=True)
class FileSpec:
    """A rendered file to write on a host before any process starts."""

    host: str
    path: str
    content: str = field(repr=False)  # may hold secrets (launch scripts): never in a repr
    mode: int = 0o644
    template: str = ""  # which template rendered it (for display)


@dataclass(frozen=True)
class HealthCheck:
    """How to know a process is ready: HTTP GET `url` returns `expect_status`. Where builds
    without that endpoint exist (memcache before 1.3, Mooncake before 0.3.13), also ready when
    `ready_port` listens and the log has `ready_log`."""

    url: str
    expect_status: int = 200
    timeout_s: float = 600.0
    interval_s: float = 0.5
    ready_port: int | None = None
    ready_log: str = ""


@dataclass(frozen=True)
class PortUse:
    """One listening port (or a hidden range member) and who owns it."""

    host: str
    port: int
    owner: str  # process name
    purpose: str  # "http", "kv_port rank 3", "meta rpc", ...


@dataclass(frozen=True)
class ProcessSpec:
    """One long-running process kvpd starts, tracks and stops."""

    name: str  # unique: "metaservice-p1", "mooncake-master", "prefill-0", "decode-1-dp3", "proxy"
    host: str
    role: Role
    stage: int  # start order: all processes of stage n are healthy before stage n+1 starts
    script: str  # path of the launch script (a FileSpec on the same host)
    command: tuple[str, ...]  # the main command, for display (the script also sets env)
    env: tuple[tuple[str, str], ...] = ()
    log: str = ""
    ports: tuple[int, ...] = ()
    health: HealthCheck | None = None
    devices: tuple[int, ...] = ()
    substituted: str = ""  # non-empty when a rehearsal replaced the real part: says with what


@dataclass(frozen=True)
class Interpreter:
    """A Python on a host: by path, or the one next to a console script found on its PATH
    (the python of the venv `vllm` was installed into)."""

    path: str | None = None
    next_to: str | None = None  # a command name, resolved on the host

    @property
    def label(self) -> str:
        return self.path or f"next to `{self.next_to}`"

    def key(self) -> str:
        """plan.json's spelling: the path, or "@" + the command."""
        return self.path or f"@{self.next_to}"

    @classmethod
    def from_key(cls, key: str) -> Interpreter:
        return cls(next_to=key[1:]) if key.startswith("@") else cls(path=key)


@dataclass(frozen=True)
class PackageNeed:
    """Python packages that must be importable by one interpreter."""

    python: Interpreter
    names: tuple[str, ...]


@dataclass(frozen=True)
class HostRequirements:
    """What one host must provide before `up`; preflight verifies it read-only."""

    packages: tuple[PackageNeed, ...] = ()
    commands: tuple[str, ...] = ()
    paths: tuple[str, ...] = ()  # model directories
    shared_dirs: tuple[str, ...] = ()  # must be one filesystem for every host listing it
    memory_gb: float = 0.0  # free memory the KV pools need
    shm_gb: float = 0.0  # free /dev/shm the UCM cache buffers need
    npu: bool = False  # NPUs must be visible (npu-smi)
    clang_omp: bool = False  # Clang and omp.h (the sparse planner's native code)

    def to_dict(self) -> dict[str, Any]:
        """plan.json's form."""
        d = dataclasses.asdict(self)
        d["packages"] = {p.python.key(): list(p.names) for p in self.packages}
        for k in ("commands", "paths", "shared_dirs"):
            d[k] = list(d[k])
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> HostRequirements:
        return cls(
            packages=tuple(
                PackageNeed(Interpreter.from_key(k), tuple(v)) for k, v in d["packages"].items()
            ),
            commands=tuple(d["commands"]),
            paths=tuple(d["paths"]),
            shared_dirs=tuple(d["shared_dirs"]),
            memory_gb=d["memory_gb"],
            shm_gb=d["shm_gb"],
            npu=d["npu"],
            clang_omp=d["clang_omp"],
        )


@dataclass(frozen=True)
class LogCheck:
    """A line the guides tell the user to look for in a process's log; `kvpd bench` checks it.
    Kinds: `layerwise_reuse` (AscendStore layerwise buffer reuse is on), `store_hits` (the
    per-request `hit external` counts of a UCM or kvpd store connector)."""

    process: str
    kind: str


@dataclass(frozen=True)
class SparseSizing:
    """The inputs of the sparse-offload hot-buffer estimate `kvpd plan` shows (model facts the
    profile may leave unset are None; the estimate then says which are missing)."""

    topk_buffer_size: int
    index_topk: int | None
    kv_lora_rank: int | None
    qk_rope_head_dim: int | None
    layers: int | None
    block_size: int
    max_model_len: int | None
    rows: int


@dataclass(frozen=True)
class Sizing:
    """What the plan's sizing rests on; plan.json spells only the parts that are known."""

    kv_bytes_per_token: int | None = None
    sparse: SparseSizing | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Sizing:
        sparse = d.get("sparse")
        return cls(
            kv_bytes_per_token=d.get("kv_bytes_per_token"),
            sparse=SparseSizing(**sparse) if sparse is not None else None,
        )


@dataclass(frozen=True)
class Plan:
    """Everything `up` does, in order. Built by `kvpd.plan.build.build_plan` (pure)."""

    deployment: str
    profile_digest: str
    hosts: tuple[HostSpec, ...]
    files: tuple[FileSpec, ...]
    processes: tuple[ProcessSpec, ...]
    ports: tuple[PortUse, ...] = ()
    warnings: tuple[str, ...] = ()
    proxy_url: str = ""
    served_model: str = ""
    tokenizer: str = ""
    bench: BenchSpec = field(default_factory=default_bench)
    rehearsal: bool = False
    # What preflight verifies per host (read-only), by host name.
    requirements: dict[str, HostRequirements] = field(default_factory=dict)
    fresh_dirs: tuple[str, ...] = ()  # relative to each host's run dir; emptied by every `up`
    made_dirs: tuple[str, ...] = ()  # relative to each host's run dir; the launch scripts make them
    # Inputs of the sizing `kvpd plan` shows (e.g. the sparse-offload hot buffer)
    sizing: Sizing = field(default_factory=Sizing)
    # The node bundle: which hosts get kvpd, for which processes and Python (kvpd.plan.bundle)
    bundle: tuple[BundleUse, ...] = ()
    # Values of secret env vars (API keys, tokens). Only the in-memory plan has them, for the
    # launch scripts `up` writes; every serialised form (plan.json, --json, state.json) masks
    # them, and they are never compared or shown.
    secret_values: tuple[str, ...] = field(default=(), repr=False, compare=False)
    # proxy.client_key_file: where on the controller the proxy's client key is (not the key)
    client_key_file: str = ""
    log_checks: tuple[LogCheck, ...] = ()
    # Every size the plan derived, with its formula's inputs (kvpd.plan.derived)
    derived: tuple[str, ...] = ()
    # runtime.lease_s: the time to live of the deployment's lease (kvpd.exec.lease.model)
    lease_s: int = 60

    @property
    def stages(self) -> list[list[ProcessSpec]]:
        """Processes grouped by stage, in start order."""
        out: dict[int, list[ProcessSpec]] = {}
        for p in self.processes:
            out.setdefault(p.stage, []).append(p)
        return [out[k] for k in sorted(out)]

    @property
    def proxy_host(self) -> str:
        """The host `proxy_url` belongs to (the proxy's, else the serving mixed engine's): its
        transport is the way to the URL. "" without a serving URL."""
        if not self.proxy_url:
            return ""
        for role in (Role.PROXY, Role.MIXED):
            for p in self.processes:
                if p.role == role:
                    return p.host
        return ""

    def host(self, name: str) -> HostSpec:
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(name)

    def process(self, name: str) -> ProcessSpec:
        for p in self.processes:
            if p.name == name:
                return p
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["requirements"] = {h: r.to_dict() for h, r in self.requirements.items()}
        for h in d["hosts"]:  # hosts without these keep plan.json's old form
            for key in ("container", "jump_key"):
                if h.get(key) is None:
                    h.pop(key, None)
            if not h.get("bundle_builder"):
                h.pop("bundle_builder", None)
        d["sizing"] = self.sizing.to_dict()
        secrets = d.pop("secret_values")
        for key in ("client_key_file", "made_dirs"):  # unset: plan.json keeps its old form
            if not d[key]:
                d.pop(key)
        if d["lease_s"] == 60:  # the default: plan.json keeps its old form
            d.pop("lease_s")
        for f in d["files"]:
            for s in secrets:
                f["content"] = f["content"].replace(s, "****")
        return d

    def to_json(self, **kw: Any) -> str:
        return json.dumps(self.to_dict(), indent=kw.pop("indent", 2), sort_keys=False, **kw)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Plan:
        def proc(p: dict[str, Any]) -> ProcessSpec:
            p = dict(p)
            p["role"] = Role(p["role"])  # ValueError for a word that is not a role
            p["command"] = tuple(p["command"])
            p["env"] = tuple(tuple(kv) for kv in p["env"])
            p["ports"] = tuple(p["ports"])
            p["devices"] = tuple(p["devices"])
            p["health"] = HealthCheck(**p["health"]) if p.get("health") else None
            return ProcessSpec(**p)

        return cls(
            deployment=d["deployment"],
            profile_digest=d["profile_digest"],
            hosts=tuple(HostSpec.from_dict(h) for h in d["hosts"]),
            files=tuple(FileSpec(**f) for f in d["files"]),
            processes=tuple(proc(p) for p in d["processes"]),
            ports=tuple(PortUse(**u) for u in d.get("ports", ())),
            warnings=tuple(d.get("warnings", ())),
            proxy_url=d.get("proxy_url", ""),
            served_model=d.get("served_model", ""),
            tokenizer=d.get("tokenizer", ""),
            bench=BenchSpec.from_dict(d.get("bench") or {}),
            rehearsal=d.get("rehearsal", False),
            requirements={
                h: HostRequirements.from_dict(r) for h, r in d.get("requirements", {}).items()
            },
            fresh_dirs=tuple(d.get("fresh_dirs", ())),
            made_dirs=tuple(d.get("made_dirs", ())),
            sizing=Sizing.from_dict(d.get("sizing", {})),
            bundle=tuple(BundleUse.from_dict(u) for u in d.get("bundle", ())),
            log_checks=tuple(LogCheck(**c) for c in d.get("log_checks", ())),
            derived=tuple(d.get("derived", ())),
            client_key_file=d.get("client_key_file", ""),
            lease_s=int(d.get("lease_s", 60)),
        )
