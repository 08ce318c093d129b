"""The node bundle in the plan (pure): which hosts get kvpd, for which processes, with which Python.

A process that imports kvpd on a node (an engine loading `KvpdStoreConnector`, an engine running
kvpd's sparse planner, the kvpd proxy) gets kvpd from the deployment's run dir, never from the
user's environments: `kvpd up` installs a wheel of kvpd, built for the host's platform, into
`<run dir>/bundle/<wheel digest>/` and points the slot `<run dir>/bundle/<slot>` at it. The launch
script of each such process puts its slot first on `PYTHONPATH`; no other process sees kvpd.

A slot is one Python interpreter of a host: `engine` (the interpreter of the vLLM command) or
`proxy` (the interpreter the proxy runs with). The plan only says which slots exist and why;
resolving the interpreter, choosing or building the wheel and installing it is the executor's
(`kvpd.exec.bundle.installer`).
"""

from __future__ import annotations

import dataclasses
import posixpath
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal

from kvpd.plan.rehearsal_mode import CPU_VLLM, Rehearsal
from kvpd.plan.supervision import policy_for
from kvpd.profile.roles import ENGINE_ROLES, Role

if TYPE_CHECKING:  # only types: kvpd.plan.value imports this module
    from kvpd.plan.processes import ProcessDraft
    from kvpd.profile.schema import Group, Profile

BUNDLE_DIR = "bundle"  # below each host's run dir
BundleSlotName = Literal["engine", "proxy"]
ENGINE_SLOT: Final = "engine"
PROXY_SLOT: Final = "proxy"


@dataclass(frozen=True)
class BundleUse:
    """One host's Python that needs kvpd, and the processes that run with it."""

    host: str
    slot: BundleSlotName  # the folder put on PYTHONPATH (bundle/<slot>)
    # The interpreter: a path or command on the host's PATH, or "@CMD": the interpreter of the
    # console script CMD (its #! line), i.e. the engine's own Python for `@vllm`.
    python: str
    processes: tuple[str, ...]
    why: tuple[str, ...]  # one reason per process, e.g. "decode-0: kv connector kvpd_store"
    native: str = "optional"  # "required" (kvpd planner) | "preferred" (planner auto) | "optional"

    @property
    def path(self) -> str:
        """The slot, relative to the host's run dir (what PYTHONPATH gets)."""
        return posixpath.join(BUNDLE_DIR, self.slot)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> BundleUse:
        return BundleUse(
            host=d["host"],
            slot=d["slot"],
            python=d["python"],
            processes=tuple(d["processes"]),
            why=tuple(d["why"]),
            native=d.get("native", "optional"),
        )


def sparse_planner(group: Group | None) -> str | None:
    """The sparse-offload planner a decode group asks for: "kvpd", "auto", "upstream", or None
    without sparse offload.

    Hook for `decode.sparse_offload.planner` (added by the native-planner work): until that
    field exists every group reads as "upstream", i.e. vLLM-Ascend's own planner, no bundle.
    """
    so = getattr(group, "sparse_offload", None)
    if so is None or not so.enabled:
        return None
    return str(getattr(so, "planner", "upstream"))


def native_need(group: Group | None) -> str:
    """How much a group's processes need the native core ("needs native core" predicate)."""
    return {"kvpd": "required", "auto": "preferred"}.get(sparse_planner(group) or "", "optional")


def proxy_python(profile: Profile, rehearsal: Rehearsal) -> str:
    """The interpreter of the kvpd proxy: `proxy.python` when the profile sets it, else the
    runtime's (or, rehearsing, the rehearsal's) Python."""
    px = profile.proxy
    if px is not None and "python" in px.model_fields_set:
        return px.python
    return rehearsal.python(profile)


def _reasons(
    profile: Profile, p: ProcessDraft, rehearsal: Rehearsal
) -> tuple[BundleSlotName, str] | None:
    """(slot, why) when process `p` imports kvpd, else None. A supervised process imports kvpd
    for its supervisor (`python -m kvpd.supervisor`, standard library only)."""
    supervised: tuple[BundleSlotName, str] | None = None
    if policy_for(profile, p.role) is not None:
        supervised = (PROXY_SLOT if p.role == Role.PROXY else ENGINE_SLOT, "supervised (restart)")
    if p.role == Role.PROXY:
        px = profile.proxy
        if px is not None and (px.impl == "kvpd" or rehearsal.on):
            return PROXY_SLOT, "kvpd proxy"
        return supervised
    if p.role not in ENGINE_ROLES:
        return None
    group: Group = profile.engine_group(p.role)
    if not rehearsal.on and "kvpd_store" in group.kv_connectors:
        return ENGINE_SLOT, "kv connector kvpd_store"
    if rehearsal.engine == CPU_VLLM and group.kv_connectors:
        return ENGINE_SLOT, "rehearsal KV connector (kvpd's ExampleConnector)"
    planner = sparse_planner(group) if p.role == Role.DECODE else None
    if planner in ("kvpd", "auto"):
        return ENGINE_SLOT, f"sparse planner {planner}"
    return supervised


def bundle_uses(
    profile: Profile, procs: list[ProcessDraft], rehearsal: Rehearsal
) -> tuple[BundleUse, ...]:
    """Every (host, slot) that needs the bundle, in host order of the profile."""
    found: dict[tuple[str, BundleSlotName], dict[str, Any]] = {}
    rank = {"optional": 0, "preferred": 1, "required": 2}
    for p in procs:
        r = _reasons(profile, p, rehearsal)
        if r is None:
            continue
        slot, why = r
        python = (
            proxy_python(profile, rehearsal)
            if slot == PROXY_SLOT
            else rehearsal.engine_python(profile, p.host)
        )
        need = native_need(profile.engine_group(p.role)) if slot == ENGINE_SLOT else "optional"
        u = found.setdefault(
            (p.host, slot),
            {"python": python, "processes": [], "why": [], "native": "optional"},
        )
        u["processes"].append(p.name)
        u["why"].append(f"{p.name}: {why}")
        if rank[need] > rank[u["native"]]:
            u["native"] = need
    order = {h: i for i, h in enumerate(profile.hosts)}
    return tuple(
        BundleUse(
            host=host,
            slot=slot,
            python=u["python"],
            processes=tuple(u["processes"]),
            why=tuple(u["why"]),
            native=u["native"],
        )
        for (host, slot), u in sorted(found.items(), key=lambda kv: (order[kv[0][0]], kv[0][1]))
    )


def with_bundle_paths(procs: list[ProcessDraft], uses: tuple[BundleUse, ...]) -> list[ProcessDraft]:
    """The processes, each that needs kvpd with its slot as `pythonpath` (the launch script
    prepends it to PYTHONPATH)."""
    slot_of = {(name, u.host): u.path for u in uses for name in u.processes}
    return [
        dataclasses.replace(p, pythonpath=(slot_of[(p.name, p.host)],))
        if (p.name, p.host) in slot_of
        else p
        for p in procs
    ]
