"""Facts derived once from a profile and its layout, shared by every rule (pure).

Rules read effective values (a group's options over the engine defaults, the block size a
group really runs with, its environment, the hardware of its hosts) from here instead of each
re-deriving them, so two rules cannot disagree about what a profile means.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kvpd.plan.layout import ROLES, Layout, hardware_of, merged
from kvpd.plan.processes import ProcessDraft, proxy_flow
from kvpd.profile.schema import Group, Hardware, Profile, ServeOptions

MEMCACHE_USERS = frozenset({"ascend_store"})


@dataclass(frozen=True)
class GroupFacts:
    """One engine group (`prefill`, `decode` or `mixed`) with its effective settings."""

    role: str
    group: Group
    opts: ServeOptions  # engine defaults overlaid with the group's own options
    block_size: int  # --block-size if given, else model.block_size
    max_model_len: int | None
    env: Mapping[str, str]  # profile env overlaid with engine/group env
    connectors: frozenset[str]
    hardware: frozenset[str]  # hardware of the group's (known) hosts


@dataclass(frozen=True)
class Facts:
    profile: Profile
    layout: Layout
    procs: tuple[ProcessDraft, ...]
    groups: tuple[GroupFacts, ...]
    memcache_ranks: int
    proxy_flow: str

    def group(self, role: str) -> GroupFacts | None:
        return next((g for g in self.groups if g.role == role), None)

    def hardware(self, host: str) -> Hardware:
        return hardware_of(self.profile, host)

    @property
    def all_connectors(self) -> frozenset[str]:
        return frozenset(c for g in self.groups for c in g.connectors)


def memcache_ranks(profile: Profile, layout: Layout) -> int:
    """LocalService ranks that join memcache: every TP x PP rank of every memcache user."""
    n = 0
    for role in ROLES:
        g = profile.group(role)
        if g is None or not MEMCACHE_USERS & set(g.kv_connectors):
            continue
        if g.layerwise is None or g.layerwise.backend == "memcache":
            n += sum(len(ep.dp_ranks) * g.tp * g.pp for ep in layout.procs if ep.role == role)
    return n


def derive_facts(profile: Profile, layout: Layout, procs: list[ProcessDraft]) -> Facts:
    groups = []
    for role in ROLES:
        g: Group | None = profile.group(role)
        if g is None:
            continue
        opts = merged(profile, g)
        groups.append(
            GroupFacts(
                role=role,
                group=g,
                opts=opts,
                block_size=opts.block_size or profile.model.block_size,
                max_model_len=opts.max_model_len or profile.model.max_model_len,
                env={**profile.env, **(opts.env or {})},
                connectors=frozenset(g.kv_connectors),
                hardware=frozenset(hardware_of(profile, h) for h in g.hosts if h in profile.hosts),
            )
        )
    return Facts(
        profile=profile,
        layout=layout,
        procs=tuple(procs),
        groups=tuple(groups),
        memcache_ranks=memcache_ranks(profile, layout),
        proxy_flow=proxy_flow(profile),
    )
