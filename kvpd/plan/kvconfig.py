"""The `--kv-transfer-config` (and `--additional-config`) JSON of each engine process (pure)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvpd.plan.layout import EnginePlacement, hardware_of
from kvpd.profile.roles import Role
from kvpd.profile.schema import Group, Profile

DEFAULT_ROLE = {"prefill": "kv_producer", "decode": "kv_consumer", "mixed": "kv_both"}
UCM_CONFIG = "conf/ucm.yaml"
MOONCAKE_CONFIG = "conf/mooncake.json"
MMC_META = "conf/mmc-meta.conf"
MMC_LOCAL = "conf/mmc-local.conf"


def kv_role(role: str, group: Group) -> str:
    return group.kv_role or DEFAULT_ROLE[role]


def memfabric_protocol(profile: Profile, group: Group) -> str | None:
    """The protocol to render: explicit, or `device_urma` on 950 (the guide requires it there);
    A3's default `sdma` is left implicit as in the guide."""
    if group.memfabric_protocol:
        return group.memfabric_protocol
    if any(hardware_of(profile, h) == "950" for h in group.hosts):
        return "device_urma"
    return None


def ucm_config_path(profile: Profile) -> str:
    ucm = profile.kv.ucm
    return ucm.config_file if ucm and ucm.config_file else UCM_CONFIG


@dataclass(frozen=True)
class _Engine:
    """The engine a connector's JSON is for: its profile, role, group and placement."""

    profile: Profile
    role: str
    group: Group
    proc: EnginePlacement

    @property
    def kv_role(self) -> str:
        return kv_role(self.role, self.group)


def _example(e: _Engine) -> dict[str, Any]:
    return {
        "kv_connector": "ExampleConnector",
        "kv_role": e.kv_role,
        "kv_connector_extra_config": {"shared_storage_path": e.profile.kv.example_path},
    }


def _nixl(e: _Engine) -> dict[str, Any]:
    out: dict[str, Any] = {"kv_connector": "NixlConnector", "kv_role": e.kv_role}
    if hardware_of(e.profile, e.proc.host) == "cpu":
        out["kv_buffer_device"] = "cpu"
    return out


def _kvpd_store(e: _Engine) -> dict[str, Any]:
    st = e.profile.kv.kvpd_store
    extra: dict[str, Any] = {"store_path": st.path if st else None}
    if st:
        extra["dram_cache_gb"] = st.dram_cache_gb
        if st.capacity_gb is not None:
            extra["capacity_gb"] = st.capacity_gb
        extra["io_threads"] = st.io_threads
    return {
        "kv_connector": "KvpdStoreConnector",
        "kv_connector_module_path": "kvpd.connectors.store",
        "kv_role": e.kv_role,
        "kv_connector_extra_config": extra,
    }


def _ucm(e: _Engine) -> dict[str, Any]:
    # UCM's role does not change its logic; the guide runs it as kv_both everywhere.
    return {
        "kv_connector": "UCMConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"UCM_CONFIG_FILE": ucm_config_path(e.profile)},
    }


def _mooncake(e: _Engine, name: str) -> dict[str, Any]:
    p, d = e.profile.prefill, e.profile.decode
    sizes: dict[str, Any] = {}
    if p is not None:
        sizes["prefill"] = {"dp_size": p.dp, "tp_size": p.tp}
        if p.pp > 1:
            sizes["prefill"]["pp_size"] = p.pp
    if d is not None:
        sizes["decode"] = {"dp_size": d.dp, "tp_size": d.tp}
    return {
        "kv_connector": name,
        "kv_role": e.kv_role,
        "kv_port": e.proc.kv_port,
        "kv_connector_extra_config": sizes,
    }


def _sfa_d2h(e: _Engine) -> dict[str, Any]:
    extra: dict[str, Any] = {"transfer_backend": "memfabric"}
    out: dict[str, Any] = {"kv_connector": "SfaRemoteD2HConnector", "kv_role": e.kv_role}
    if e.role == Role.DECODE:
        out["kv_port"] = e.proc.kv_port
        extra["use_layerwise"] = True
    proto = memfabric_protocol(e.profile, e.group)
    if proto:
        extra["memfabric_transfer_protocol"] = proto
    out["kv_connector_extra_config"] = extra
    return out


def _ascend_store(e: _Engine) -> dict[str, Any]:
    lw = e.group.layerwise
    extra: dict[str, Any] = {"backend": lw.backend if lw else "memcache"}
    if lw is not None:
        extra["use_layerwise"] = lw.use_layerwise
        if lw.num_shared_buffers is not None:
            extra["layerwise_num_shared_buffers"] = lw.num_shared_buffers
        extra["layerwise_independent_layers"] = lw.independent_layers
        if lw.prefetch_layers is not None:
            extra["layerwise_prefetch_layers"] = lw.prefetch_layers
    return {
        "kv_connector": "AscendStoreConnector",
        "kv_role": e.kv_role,
        "kv_connector_extra_config": extra,
    }


_COMPONENTS: dict[str, Callable[[_Engine], dict[str, Any]]] = {
    "example": _example,
    "nixl": _nixl,
    "kvpd_store": _kvpd_store,
    "ucm": _ucm,
    "mooncake": lambda e: _mooncake(e, "MooncakeConnectorV1"),
    "mooncake_layerwise": lambda e: _mooncake(e, "MooncakeLayerwiseConnector"),
    "sfa_d2h": _sfa_d2h,
    "ascend_store": _ascend_store,
}


def _component(
    comp: str, profile: Profile, role: str, group: Group, proc: EnginePlacement
) -> dict[str, Any]:
    if comp not in _COMPONENTS:
        raise ValueError(f"unknown KV component {comp!r}")
    return _COMPONENTS[comp](_Engine(profile, role, group, proc))


def kv_transfer_config(
    profile: Profile, role: str, group: Group, proc: EnginePlacement
) -> dict[str, Any] | None:
    comps = group.kv_connectors
    if not comps:
        return None
    children = [_component(c, profile, role, group, proc) for c in comps]
    if len(children) == 1:
        return children[0]
    return {
        "kv_connector": "MultiConnector",
        "kv_role": kv_role(role, group),
        "kv_connector_extra_config": {"connectors": children},
    }


def additional_config(group: Group, base: dict[str, Any] | None) -> dict[str, Any] | None:
    out = dict(base or {})
    so = group.sparse_offload
    if so is not None and so.enabled:
        cfg: dict[str, Any] = {
            "enabled": True,
            "topk_buffer_size": so.topk_buffer_size,
            "dram_size_per_dp_GB": so.dram_size_per_dp_gb,
        }
        if so.keep_device_kv_cache:
            cfg["keep_device_kv_cache"] = True
        out["sparse_kv_offload_config"] = cfg
    return out or None
