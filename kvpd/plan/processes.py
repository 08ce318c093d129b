"""Every process of a deployment as data: command, environment, ports, health check (pure)."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvpd.plan.bundle import proxy_python
from kvpd.plan.engine_argv import addr, engine_argv
from kvpd.plan.engine_env import engine_env
from kvpd.plan.kvconfig import MMC_META
from kvpd.plan.layout import EnginePlacement, Layout, merged
from kvpd.plan.memcache_compat import has_http, ready_line
from kvpd.plan.proxyargs import proxy_routing_args, proxy_timeout_args
from kvpd.plan.rehearsal_mode import REAL
from kvpd.plan.value import Interpreter
from kvpd.profile.roles import DECODING_ROLES, Role
from kvpd.profile.schema import Group, Profile, ServeOptions

STAGE = {"metaservice": 0, "mooncake": 0, "prefill": 1, "decode": 1, "mixed": 1, "proxy": 2}


@dataclass(frozen=True)
class ProcessDraft:
    """A process before rendering: the launch script is made from `source`, `env`, `argv`."""

    name: str
    host: str
    role: Role
    stage: int
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    source: tuple[str, ...] = ()  # scripts to `source` first (set_env.sh)
    ports: tuple[tuple[int, str], ...] = ()  # (port, purpose)
    health_url: str = ""
    # without the HTTP endpoint (older builds): ready when this port listens and the log says so
    ready: tuple[int, str] | None = None
    devices: tuple[int, ...] = ()
    files: tuple[str, ...] = ()  # rendered config files this process reads
    notes: tuple[str, ...] = field(default_factory=tuple)
    # Node bundle slots (relative to the run dir) the launch script puts first on PYTHONPATH:
    # set by kvpd.plan.bundle for the processes that import kvpd.
    pythonpath: tuple[str, ...] = ()
    # Set by a maker that knows better than the role's defaults (a rehearsal's substitute):
    health_timeout_s: float | None = None  # else the runtime's, by role
    needs: StatedNeeds | None = None  # else derived from the role and the profile


@dataclass(frozen=True)
class StatedNeeds:
    """What a process needs on its host, stated by whatever made it (`requirements` derives
    the needs of a real engine from its role and connectors instead)."""

    packages: tuple[tuple[Interpreter, str], ...] = ()  # (interpreter, distribution)
    paths: tuple[str, ...] = ()
    shared_dirs: tuple[str, ...] = ()


def engine_proc(profile: Profile, group: Group, ep: EnginePlacement, stage: int) -> ProcessDraft:
    opts: ServeOptions = merged(profile, group)
    setup = engine_env(profile, group, ep, opts)
    ports: list[tuple[int, str]] = [(ep.port, "http")]
    ports += kv_ports(profile, group, ep)
    if ep.per_rank and group.dp > 1 and ep.dp_ranks[0] == 0:
        ports.append((group.dp_rpc_port, "data-parallel rpc"))
    return ProcessDraft(
        name=ep.name,
        host=ep.host,
        role=ep.role,
        stage=stage,
        argv=tuple(engine_argv(profile, group, ep, opts)),
        env=tuple(setup.env.items()),
        source=tuple(setup.source),
        ports=tuple(ports),
        health_url=f"http://{addr(profile, ep.host)}:{ep.port}/health",
        devices=ep.devices,
        files=tuple(setup.files),
    )


def kv_ports(profile: Profile, group: Group, ep: EnginePlacement) -> list[tuple[int, str]]:
    """Hidden listening ports of a process: connector side channels (see vllm-ascend.md)."""
    comps = set(group.kv_connectors)
    out: list[tuple[int, str]] = []
    if ep.kv_port is None:
        return out
    if comps & {"mooncake", "mooncake_layerwise"}:
        # side channel = kv_port + dp_rank*tp*pp*cp; rank binds side + (pp_rank*cp+cp_rank)*tp + tp
        for r in ep.dp_ranks:
            side = ep.kv_port + r * group.tp * group.pp * group.cp
            for i in range(group.tp * group.pp * group.cp):
                out.append((side + i, f"mooncake kv_port dp{r} rank{i}"))
    elif "nixl" in comps:
        out.append((ep.kv_port, "nixl side channel"))
    elif "sfa_d2h" in comps and ep.role == Role.DECODE:
        for r in ep.dp_ranks:
            for t in range(group.tp):
                out.append((ep.kv_port + r * group.tp + t, f"sfa_d2h kv_port dp{r} tp{t}"))
    return out


def service_procs(profile: Profile) -> list[ProcessDraft]:
    """The memcache MetaService and the Mooncake master."""
    out: list[ProcessDraft] = []
    kv = profile.kv
    mc = kv.memcache
    if mc is not None and mc.host in profile.hosts:
        a = addr(profile, mc.host)
        out.append(
            ProcessDraft(
                name="metaservice",
                host=mc.host,
                role=Role.METASERVICE,
                stage=STAGE["metaservice"],
                argv=(
                    mc.python,
                    "-c",
                    "from memcache_hybrid import MetaService; MetaService.main()",
                ),
                env=(("MMC_META_CONFIG_PATH", MMC_META),),
                source=tuple(mc.set_env),
                ports=(
                    (mc.port, "memcache meta rpc"),
                    (mc.config_store_port, "memcache config store"),
                    (mc.metrics_port, "memcache metrics http"),
                ),
                health_url=f"http://{a}:{mc.metrics_port}/health" if has_http(mc) else "",
                ready=(mc.port, ready_line(mc)),
                files=(MMC_META,),
            )
        )
    mk = kv.mooncake
    if mk is not None and mk.host in profile.hosts:
        a = addr(profile, mk.host)
        argv = [mk.binary, "--port", str(mk.port)]
        argv += ["--eviction_high_watermark_ratio", f"{mk.eviction_high_watermark_ratio:g}"]
        argv += ["--eviction_ratio", f"{mk.eviction_ratio:g}"]
        argv += ["--default_kv_lease_ttl", str(mk.default_kv_lease_ttl)]
        if mk.metrics_port != 9003:
            argv += ["--metrics_port", str(mk.metrics_port)]
        ports = [(mk.port, "mooncake master rpc"), (mk.metrics_port, "mooncake metrics/admin")]
        if mk.http_metadata_port is not None:
            argv += ["--enable_http_metadata_server=true"]
            argv += ["--http_metadata_server_port", str(mk.http_metadata_port)]
            ports.append((mk.http_metadata_port, "mooncake http metadata"))
        argv += mk.extra_args
        env: tuple[tuple[str, str], ...] = ()
        if mk.ld_library_path:
            env = (("LD_LIBRARY_PATH", f"{mk.ld_library_path}:$LD_LIBRARY_PATH"),)
        out.append(
            ProcessDraft(
                name="mooncake-master",
                host=mk.host,
                role=Role.MOONCAKE,
                stage=STAGE["mooncake"],
                argv=tuple(argv),
                env=env,
                ports=tuple(ports),
                health_url=f"http://{a}:{mk.metrics_port}/health",
                ready=(mk.port, "Master service started on port"),
            )
        )
    return out


ADMIN_TOKEN_FILE = "proxy/admin-token"  # relative to the proxy host's run dir
CLIENT_KEY_FILE = "proxy/client-key"  # `up` copies proxy.client_key_file (exec/client_key.py)


def proxy_proc(profile: Profile, engines: list[ProcessDraft], stage: int) -> ProcessDraft | None:
    """The P/D proxy in front of `engines`: kvpd's, or vLLM-Ascend's example script."""
    px = profile.proxy
    if px is None or px.host not in profile.hosts:
        return None
    if px.impl == "kvpd":
        return kvpd_proxy(profile, engines, stage, proxy_python(profile, REAL), proxy_flow(profile))
    flow = proxy_flow(profile)
    a = addr(profile, px.host)
    script = px.script or (
        "examples/disaggregated_prefill_v1/"
        + (
            "load_balance_proxy_layerwise_server_example.py"
            if flow == "layerwise"
            else "load_balance_proxy_server_example.py"
        )
    )
    argv = [px.python, script, "--port", str(px.port), "--host", px.bind or a]
    return _proxy(profile, engines, stage, argv, f"http://{a}:{px.port}/healthcheck")


def kvpd_proxy(
    profile: Profile, engines: list[ProcessDraft], stage: int, python: str, flow: str
) -> ProcessDraft | None:
    """kvpd's proxy with `flow` in front of `engines`, as `python -m kvpd.proxy` from the node
    bundle in the run dir (PYTHONPATH, kvpd.plan.bundle): nothing of kvpd installed on the host."""
    px = profile.proxy
    if px is None or px.host not in profile.hosts:
        return None
    a = addr(profile, px.host)
    argv = [python, "-m", "kvpd.proxy", "--host", px.bind or a, "--port", str(px.port)]
    return _proxy(profile, engines, stage, argv, f"http://{a}:{px.port}/health", flow)


def _proxy(
    profile: Profile,
    engines: list[ProcessDraft],
    stage: int,
    argv: list[str],
    health: str,
    flow: str | None = None,
) -> ProcessDraft:
    px = profile.proxy
    assert px is not None
    pre = [p for p in engines if p.role == Role.PREFILL]
    dec = [p for p in engines if p.role in DECODING_ROLES]
    if pre:
        argv += ["--prefiller-hosts", *(addr(profile, p.host) for p in pre)]
        argv += ["--prefiller-ports", *(str(p.ports[0][0]) for p in pre)]
    argv += ["--decoder-hosts", *(addr(profile, p.host) for p in dec)]
    argv += ["--decoder-ports", *(str(p.ports[0][0]) for p in dec)]
    if flow is not None:  # kvpd's proxy
        routing = proxy_routing_args(profile, len(pre) or len(dec))  # prefillers, else mixed
        argv += ["--flow", flow, *proxy_timeout_args(px), *routing]
        # The token itself is written by `up` (kvpd/exec/admin_token.py), never in the plan.
        argv += ["--admin-token-file", ADMIN_TOKEN_FILE]
        argv += ["--client-key-file", CLIENT_KEY_FILE] if px.client_key_file else []
        # On SIGTERM (down, restart) in-flight requests finish; below `down`'s SIGKILL grace.
        argv += ["--shutdown-grace", "15"]
    return ProcessDraft(
        name="proxy",
        host=px.host,
        role=Role.PROXY,
        stage=stage,
        argv=tuple(argv),
        env=tuple((k, v) for k, v in profile.env.items() if k == "OPENAI_API_KEY"),
        ports=((px.port, "proxy http"),),
        health_url=health,
    )


def proxy_flow(profile: Profile) -> str:
    px = profile.proxy
    if px is not None and px.flow != "auto":
        return px.flow
    if profile.prefill is None and profile.mixed is not None:
        return "mixed"
    d = profile.decode
    return "layerwise" if d is not None and "sfa_d2h" in d.kv_connectors else "prefill-first"


def all_procs(profile: Profile, layout: Layout) -> list[ProcessDraft]:
    """The real deployment's processes, in stage order (a rehearsal transforms these)."""
    out = service_procs(profile)
    services_stage = 0 if out else -1
    engines: list[ProcessDraft] = []
    # Decode waits for prefill only where it depends on it: SfaRemoteD2H's MemFabric config
    # store is owned by the prefill side. Otherwise P and D start together, as the guides do.
    d = profile.decode
    decode_after_prefill = d is not None and "sfa_d2h" in d.kv_connectors
    for ep in layout.procs:
        group = profile.engine_group(ep.role)
        stage = services_stage + 1
        if ep.role == Role.DECODE and decode_after_prefill:
            stage += 1
        engines.append(engine_proc(profile, group, ep, stage))
    out += engines
    last = max((p.stage for p in out), default=0)
    px = proxy_proc(profile, engines, last + 1)
    return out + ([px] if px is not None else [])
