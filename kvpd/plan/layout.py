"""Where every engine process runs: hosts, devices, DP ranks, HTTP and KV ports (pure).

This is what the guides' `run_multi_dp.sh` computes by hand: for each group, `instances`
independent engines of DP x TP are placed on the group's hosts, first-fit (`placement: pack`)
or on the least-used host (`spread`), at most `dp_size_local` DP ranks of an instance per host,
contiguous devices per rank, and one `vllm serve` either per instance
(`single`) or per DP rank (`per_rank`, the external load-balancing layout of large-scale EP).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvpd.profile.roles import ENGINE_ROLES, Role
from kvpd.profile.schema import DEFAULT_DEVICES, Group, Hardware, Host, Profile, ServeOptions

ROLES = ENGINE_ROLES
DEFAULT_KV_PORT = {
    "mooncake": 20001,
    "mooncake_layerwise": 20001,
    "sfa_d2h": 20050,
    "nixl": 5600,  # NIXL side channel (VLLM_NIXL_SIDE_CHANNEL_PORT), one per process
}


@dataclass(frozen=True)
class EnginePlacement:
    name: str
    role: Role  # an engine role (ENGINE_ROLES)
    host: str
    instance: int
    dp_ranks: tuple[int, ...]  # global DP ranks served by this process
    local_index: int  # index of this process among the group's processes on its host
    devices: tuple[int, ...]
    port: int
    kv_port: int | None
    per_rank: bool  # one process per DP rank (external LB)


@dataclass
class Layout:
    procs: list[EnginePlacement] = field(default_factory=list)
    problems: list[tuple[tuple[str | int, ...], str]] = field(default_factory=list)


def host_devices(profile: Profile, host: Host) -> int:
    if host.devices is not None:
        return host.devices
    return DEFAULT_DEVICES[host.hardware or profile.hardware]


def hardware_of(profile: Profile, host_name: str) -> Hardware:
    h = profile.hosts.get(host_name)
    return (h.hardware if h and h.hardware else None) or profile.hardware


def merged(profile: Profile, group: Group) -> ServeOptions:
    """Engine defaults overlaid with the group's own settings (env and args are combined)."""
    base = profile.engine.model_dump(exclude_none=True)
    own = {
        k: v
        for k, v in group.model_dump(exclude_none=True).items()
        if k in ServeOptions.model_fields
    }
    env = {**base.get("env", {}), **own.get("env", {})}
    args = [*base.get("args", []), *own.get("args", [])]
    out = {**base, **own, "env": env, "args": args}
    return ServeOptions.model_validate(out)


def dp_size_local(profile: Profile, group: Group) -> int:
    """DP ranks of one instance per host: the profile's, else as many as fit the first host
    (`spread`: no more than an even share of the listed hosts)."""
    if group.dp_size_local is not None:
        return group.dp_size_local
    first = profile.hosts.get(group.hosts[0])
    devices = host_devices(profile, first) if first else 0
    per_host = max(1, devices // (group.tp * group.pp)) if devices else 1
    local = max(1, min(group.dp, per_host))
    if group.placement == "spread":
        local = min(local, -(-group.dp // len(group.hosts)))
    return local


def launch_per_rank(profile: Profile, group: Group) -> bool:
    if group.dp_launch == "per_rank":
        return True
    if group.dp_launch == "single":
        return False
    return group.dp > 1 and dp_size_local(profile, group) < group.dp


NIXL_BASE = {"prefill": 5600, "decode": 5700, "mixed": 5800}  # P and D may share a host


def group_kv_port(group: Group, role: str = "") -> int | None:
    if group.kv_port is not None:
        return group.kv_port
    if "nixl" in group.kv_connectors and role in NIXL_BASE:
        return NIXL_BASE[role]
    for comp in group.kv_connectors:
        if comp in DEFAULT_KV_PORT:
            return DEFAULT_KV_PORT[comp]
    return None


def build_layout(profile: Profile) -> Layout:
    """Place every engine process. Problems (not enough devices, ...) are collected, not raised."""
    out = Layout()
    used: dict[str, int] = {}  # devices taken per host, over all groups
    for role in ROLES:
        group: Group | None = profile.group(role)
        if group is None:
            continue
        unknown = [h for h in group.hosts if h not in profile.hosts]
        if unknown:
            continue  # reported by the rules with a suggestion
        _place_group(profile, role, group, used, out)
    return out


def _place_group(
    profile: Profile, role: Role, group: Group, used: dict[str, int], out: Layout
) -> None:
    per_host = dp_size_local(profile, group)
    per_rank = launch_per_rank(profile, group)
    width = group.tp * group.pp  # devices per DP rank
    count_on_host: dict[str, int] = {}
    kv_base = group_kv_port(group, role)
    cursor = [0]  # hosts before this index are full for this group: keeps placement linear
    spread_kv = any(c in ("mooncake", "mooncake_layerwise") for c in group.kv_connectors)
    nixl = "nixl" in group.kv_connectors
    for inst in range(group.instances):
        rank = 0
        mine: set[str] = set()  # hosts holding a chunk of this instance: one chunk per host
        while rank < group.dp:
            chunk = min(per_host, group.dp - rank)
            need = chunk * width
            if group.placement == "spread":
                host = _least_used(profile, group, used, need, mine)
            else:
                host = _first_fit(profile, group, used, need, cursor, mine)
            if host is None:
                total = sum(host_devices(profile, profile.hosts[h]) for h in group.hosts)
                want = group.instances * group.dp * width
                out.problems.append(
                    (
                        (role, "hosts"),
                        f"{role} needs {want} devices ({group.instances} instance(s) x dp "
                        f"{group.dp} x tp {group.tp} x pp {group.pp}) in chunks of {need} per "
                        f"host (dp_size_local {per_host} ranks of an instance per host), but "
                        f"hosts {group.hosts} provide {total} in total (after other groups). "
                        "Add hosts, lower dp/tp, raise dp_size_local, or set `devices:` on the "
                        "hosts.",
                    )
                )
                return
            mine.add(host)
            start = used.get(host, 0)
            used[host] = start + need
            ranks = tuple(range(rank, rank + chunk))
            procs = [(r,) for r in ranks] if per_rank else [ranks]
            for i, proc_ranks in enumerate(procs):
                idx = count_on_host.get(host, 0)
                count_on_host[host] = idx + 1
                first_dev = start + (i * width if per_rank else 0)
                ndev = width if per_rank else need
                kv_port = None
                if kv_base is not None:
                    # MooncakeConnectorV1 binds kv_port + dp_rank*tp + tp_rank per process, so
                    # processes sharing a host are spaced by tp (run_multi_dp.sh: base + i*tp).
                    if spread_kv:
                        kv_port = kv_base + idx * width
                    elif nixl:  # every engine on a host needs its own side-channel port
                        kv_port = kv_base + idx
                    else:
                        kv_port = kv_base
                out.procs.append(
                    EnginePlacement(
                        name=_name(role, group, inst, proc_ranks, per_rank),
                        role=role,
                        host=host,
                        instance=inst,
                        dp_ranks=proc_ranks,
                        local_index=idx,
                        devices=tuple(range(first_dev, first_dev + ndev)),
                        port=group.port + idx,
                        kv_port=kv_port,
                        per_rank=per_rank,
                    )
                )
            rank += chunk


def _free(profile: Profile, used: dict[str, int], host: str) -> int:
    return host_devices(profile, profile.hosts[host]) - used.get(host, 0)


def _first_fit(
    profile: Profile,
    group: Group,
    used: dict[str, int],
    need: int,
    cursor: list[int],
    skip: set[str],
) -> str | None:
    """The first listed host with room that holds no chunk of this instance yet. Hosts from
    `cursor` on that cannot fit a chunk are passed for good (chunks never grow), which keeps
    placement linear."""
    hosts = group.hosts
    for i in range(cursor[0], len(hosts)):
        h = hosts[i]
        fits = _free(profile, used, h) >= need
        if not fits and i == cursor[0]:
            cursor[0] = i + 1
        if fits and h not in skip:
            return h
    return None


def _least_used(
    profile: Profile, group: Group, used: dict[str, int], need: int, skip: set[str]
) -> str | None:
    """`spread`: the listed host with the most free devices (first listed on a tie)."""
    fits = [h for h in group.hosts if h not in skip and _free(profile, used, h) >= need]
    return max(fits, key=lambda h: _free(profile, used, h), default=None)


def _name(role: str, group: Group, inst: int, ranks: tuple[int, ...], per_rank: bool) -> str:
    if per_rank and group.dp > 1:
        return f"{role}-dp{ranks[0]}" if group.instances == 1 else f"{role}-{inst}-dp{ranks[0]}"
    return f"{role}-{inst}"
