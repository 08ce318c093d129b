"""An engine's environment (pure): connector settings, network interfaces, visible devices."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvpd.plan.kvconfig import MMC_LOCAL, MOONCAKE_CONFIG, ucm_config_path
from kvpd.plan.layout import EnginePlacement, hardware_of
from kvpd.plan.sparse_planner import planner_env
from kvpd.profile.roles import Role
from kvpd.profile.schema import ASCEND, Group, Host, Profile, ServeOptions


@dataclass
class EngineEnv:
    """What the launch script sets up before `vllm serve`: variables, scripts to `source`, and
    the rendered config files the engine reads."""

    env: dict[str, str] = field(default_factory=dict)
    source: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)


def _connector_env(profile: Profile, group: Group, ep: EnginePlacement, out: EngineEnv) -> None:
    comps = set(group.kv_connectors)
    kv = profile.kv
    if "ascend_store" in comps and kv.memcache is not None:
        out.source += kv.memcache.set_env
        out.env["MMC_LOCAL_CONFIG_PATH"] = MMC_LOCAL
        out.files.append(MMC_LOCAL)
    if "sfa_d2h" in comps:
        for script in kv.memfabric.set_env:
            if script not in out.source:
                out.source.append(script)
        if kv.memfabric.extend_lib_path:
            out.env["MEMFABRIC_HYBRID_EXTEND_LIB_PATH"] = kv.memfabric.extend_lib_path
    if "nixl" in comps and ep.kv_port is not None:
        _nixl_env(profile, ep, out.env)
    if comps & {"mooncake", "mooncake_layerwise"}:
        out.env["MOONCAKE_CONFIG_PATH"] = MOONCAKE_CONFIG
        out.files.append(MOONCAKE_CONFIG)
    if "ucm" in comps:
        out.files.append(ucm_config_path(profile))


def _nixl_env(profile: Profile, ep: EnginePlacement, env: dict[str, str]) -> None:
    host = profile.hosts[ep.host]
    env["VLLM_NIXL_SIDE_CHANNEL_HOST"] = host.address
    env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(ep.kv_port)
    if hardware_of(profile, ep.host) == "cpu":  # UCX over TCP/shared memory without RDMA
        env["UCX_TLS"] = "tcp,sm,self"
        if host.address.startswith("127."):
            env["UCX_NET_DEVICES"] = "lo"


def _network_env(host: Host, hw: str, sfa_d2h: bool, env: dict[str, str]) -> None:
    ip = host.ip or host.address  # numeric (the rules refuse a name where one is needed)
    if host.nic and hw in ASCEND:
        env.setdefault("HCCL_IF_IP", ip)
        for name in ("GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "HCCL_SOCKET_IFNAME"):
            env.setdefault(name, host.nic)
    elif host.nic:
        env.setdefault("GLOO_SOCKET_IFNAME", host.nic)
        env.setdefault("NCCL_SOCKET_IFNAME", host.nic)
    if sfa_d2h or host.nic:
        # MemFabric and the ZMQ side channels advertise get_ip(), i.e. VLLM_HOST_IP.
        env.setdefault("VLLM_HOST_IP", ip)


def _device_env(hw: str, devices: tuple[int, ...], env: dict[str, str]) -> None:
    devs = ",".join(str(d) for d in devices)
    if hw in ASCEND:
        env.setdefault("ASCEND_RT_VISIBLE_DEVICES", devs)
    elif hw == "cuda":
        env.setdefault("CUDA_VISIBLE_DEVICES", devs)
    elif hw == "cpu" and devs:
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", devs)


def engine_env(
    profile: Profile, group: Group, ep: EnginePlacement, opts: ServeOptions
) -> EngineEnv:
    """The environment of the engine at `ep`: the connectors' first, then the profile's and the
    group's (which win), then what the host's network and devices need unless already set."""
    out = EngineEnv()
    _connector_env(profile, group, ep, out)
    out.env.update(planner_env(group) if ep.role == Role.DECODE else {})
    out.env.update(profile.env)
    out.env.update(opts.env or {})
    hw = hardware_of(profile, ep.host)
    _network_env(profile.hosts[ep.host], hw, "sfa_d2h" in group.kv_connectors, out.env)
    _device_env(hw, ep.devices, out.env)
    return out
