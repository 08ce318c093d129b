"""Rehearsal: a profile's real topology on CPU hosts, as one transform of the derived processes
(pure).

The real deployment is derived and validated first, exactly as for `kvpd up`; a rehearsal then
rewrites its processes: the same hosts, stages, process names, HTTP ports, proxy and bench,
with each engine replaced by what a rehearsal *engine* puts in its place (`ENGINES`: CPU vLLM
for KV proofs, a stdlib stand-in for topology rehearsals at full size). The memcache
MetaService and the Mooncake master run for real, from the rehearsal's Python environment and
without the Ascend set_env scripts; the proxy is kvpd's. Rules and requirements never see a
rehearsal: findings about the real hardware (Ascend protocols, NPU ports, HCCL addresses) are
dropped because the rehearsal runs on other hardware, and each substitute states what it needs.
`kvpd plan --rehearse` shows every substitution.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Protocol

from kvpd.errors import KvpdError
from kvpd.plan.bundle import proxy_python
from kvpd.plan.processes import ProcessDraft, kvpd_proxy, proxy_flow
from kvpd.plan.rehearsal_engines import CpuVllm, StandIn
from kvpd.plan.rehearsal_mode import REHEARSING
from kvpd.profile.roles import ENGINE_ROLES, Role
from kvpd.profile.schema import Group, Profile


class Engine(Protocol):
    """What stands in for each real engine process in a rehearsal."""

    name: str

    def substitute(
        self, profile: Profile, group: Group, real: ProcessDraft, index: int
    ) -> ProcessDraft:
        """The process that runs instead of `real` (the `index`-th engine of the plan)."""
        ...

    def note(self, profile: Profile, group: Group) -> str:
        """What `kvpd plan` says about an engine of `group` in this rehearsal."""
        ...


ENGINES: dict[str, Engine] = {e.name: e for e in (CpuVllm(), StandIn())}
DEFAULT_ENGINE = "vllm"


@dataclass(frozen=True)
class Rehearsed:
    """A rehearsal's processes and, by process name, what each stands in for."""

    procs: list[ProcessDraft]
    notes: dict[str, str]


def rehearse(profile: Profile, procs: list[ProcessDraft], engine: Engine) -> Rehearsed:
    """The real deployment's `procs` as rehearsed by `engine` on CPU hosts."""
    rh = profile.rehearsal
    out: list[ProcessDraft] = []
    notes: dict[str, str] = {}
    engines: list[ProcessDraft] = []
    for p in procs:
        if p.role in ENGINE_ROLES:
            group: Group = profile.engine_group(p.role)
            q = engine.substitute(profile, group, p, len(engines))
            engines.append(q)
            notes[p.name] = engine.note(profile, group)
        elif p.role == Role.METASERVICE:
            q = dataclasses.replace(p, argv=(rh.python, *p.argv[1:]), source=())
            notes[p.name] = "real memcache MetaService (CPU); no Ascend set_env scripts"
        elif p.role == Role.MOONCAKE:
            q = dataclasses.replace(p, argv=(rh.mooncake_master, *p.argv[1:]), env=())
            notes[p.name] = "real mooncake_master (CPU, non-CUDA wheel)"
        elif p.role == Role.PROXY:
            # kvpd's proxy whatever the profile runs; ExampleConnector and the stand-in have no
            # layerwise metaserver, so the layerwise flow becomes prefill-first.
            flow = proxy_flow(profile)
            flow = "prefill-first" if flow == "layerwise" else flow
            q = kvpd_proxy(profile, engines, p.stage, proxy_python(profile, REHEARSING), flow) or p
            notes[p.name] = f"kvpd proxy, {flow} flow"
        else:
            q = p
        out.append(q)
    return Rehearsed(out, notes)


def engine_named(name: str) -> Engine:
    """The rehearsal engine called `name`."""
    if name not in ENGINES:
        raise KvpdError(
            f"unknown rehearsal engine {name!r}; use one of: {', '.join(ENGINES)} "
            "(e.g. --rehearse-with standin)."
        )
    return ENGINES[name]
