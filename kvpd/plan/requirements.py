"""What each host must provide before `up` (pure): packages, commands, paths, memory.

`kvpd plan --check` and `kvpd up` hand this to the preflight, which verifies it read-only.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field

from kvpd.plan.layout import hardware_of
from kvpd.plan.processes import ProcessDraft
from kvpd.plan.sizing import GiB, parse_size
from kvpd.plan.sparse_planner import sparse_planner
from kvpd.plan.value import HostRequirements, Interpreter, PackageNeed
from kvpd.profile.roles import ENGINE_ROLES, Role
from kvpd.profile.schema import ASCEND, Profile


def python_of(command: str) -> Interpreter:
    """The interpreter next to a console script given by path (…/bin/vllm -> …/bin/python), or
    the one next to `command` on the host's PATH (the probe resolves it)."""
    if "/" in command:
        return Interpreter(path=posixpath.join(posixpath.dirname(command), "python"))
    return Interpreter(next_to=command)


def _add(items: list[str], item: str) -> None:
    if item not in items:
        items.append(item)


@dataclass
class _Needs:
    """One host's requirements while they are collected (frozen by `freeze`)."""

    packages: dict[Interpreter, list[str]] = field(default_factory=dict)
    commands: list[str] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    shared_dirs: list[str] = field(default_factory=list)
    memory_gb: float = 0.0
    shm_gb: float = 0.0
    npu: bool = False
    clang_omp: bool = False

    def pkg(self, python: Interpreter, name: str) -> None:
        _add(self.packages.setdefault(python, []), name)

    def freeze(self) -> HostRequirements:
        return HostRequirements(
            packages=tuple(PackageNeed(py, tuple(n)) for py, n in self.packages.items()),
            commands=tuple(self.commands),
            paths=tuple(self.paths),
            shared_dirs=tuple(self.shared_dirs),
            memory_gb=round(self.memory_gb, 1),
            shm_gb=self.shm_gb,
            npu=self.npu,
            clang_omp=self.clang_omp,
        )


# Attention kinds vLLM runs as MLA (UCM's `is_mla`): MLA and the sparse MLA variants.
MLA_KINDS = ("mla", "sfa", "dsa")


def ucm_share_buffer(profile: Profile) -> bool:
    """Whether UCM's cache buffer is a /dev/shm file: `share_buffer_enable`, which defaults to
    the model being MLA (kv-stores.md, UCM's Cache store)."""
    ucm = profile.kv.ucm
    if ucm is None:
        return False
    given = ucm.config.get("share_buffer_enable")
    if isinstance(given, bool):
        return given
    return profile.model.attention in MLA_KINDS


def ucm_shm_gb(profile: Profile, devices: int, devices_per_rank: int) -> float:
    """/dev/shm one engine process's UCM needs: `cache_buffer_capacity_gb` per DP rank when the
    share buffer is on (each DP instance creates `/dev/shm/uc_shm_cache_<engine_id>`), none
    when it is off (the buffer is then ordinary pinned memory per device)."""
    ucm = profile.kv.ucm
    if ucm is None or not ucm_share_buffer(profile):
        return 0.0
    ranks = max(1, devices // max(1, devices_per_rank))
    return float(ucm.cache_buffer_capacity_gb * ranks)


def _stated_needs(h: _Needs, p: ProcessDraft) -> None:
    assert p.needs is not None
    for py, pkg in p.needs.packages:
        h.pkg(py, pkg)
    for path in p.needs.paths:
        _add(h.paths, path)
    for d in p.needs.shared_dirs:
        _add(h.shared_dirs, d)


def _connector_needs(
    profile: Profile,
    h: _Needs,
    p: ProcessDraft,
    py: Interpreter,
    dram_per_rank: str | None,
    created_on_use: set[str],
) -> None:
    """The packages, memory and shared folders an engine's KV connectors need."""
    kv = profile.kv
    g = profile.engine_group(p.role)
    comps = set(g.kv_connectors)
    if "ascend_store" in comps:
        h.pkg(py, "memcache-hybrid")
        h.pkg(py, "memfabric-hybrid")
        if dram_per_rank:
            ranks = len(p.devices) or 1
            h.memory_gb += parse_size(dram_per_rank) * ranks / GiB
    if "sfa_d2h" in comps:
        h.pkg(py, "memfabric-hybrid")
    if "ucm" in comps and kv.ucm is not None:
        h.pkg(py, "uc-manager")
        for d in kv.ucm.storage.split(":"):
            _add(h.shared_dirs, d)
        h.shm_gb += ucm_shm_gb(profile, len(p.devices), g.tp * g.pp)
    if "kvpd_store" in comps and kv.kvpd_store is not None:
        _add(h.shared_dirs, kv.kvpd_store.path)
    if "example" in comps and kv.example_path:
        _add(h.shared_dirs, kv.example_path)
        created_on_use.add(kv.example_path)


def _engine_needs(
    profile: Profile,
    h: _Needs,
    p: ProcessDraft,
    dram_per_rank: str | None,
    created_on_use: set[str],
) -> None:
    g = profile.engine_group(p.role)
    py = python_of(profile.runtime.vllm)
    h.pkg(py, "vllm")
    _add(h.paths, profile.model.path)
    if hardware_of(profile, p.host) in ASCEND:
        h.pkg(py, "vllm-ascend")
        h.npu = True
    _connector_needs(profile, h, p, py, dram_per_rank, created_on_use)
    so = g.sparse_offload
    if p.role == Role.DECODE and so is not None and so.enabled:
        # vLLM-Ascend JIT-compiles its planner at start; kvpd's ships prebuilt.
        h.clang_omp = h.clang_omp or sparse_planner(g) == "upstream"
        dp_ranks = max(1, len(p.devices) // max(1, g.tp * g.pp))
        h.memory_gb += so.dram_size_per_dp_gb * dp_ranks


def _drop_own_dirs(
    profile: Profile,
    req: dict[str, _Needs],
    run_dirs: dict[str, str] | None,
    created_on_use: set[str],
) -> None:
    # Folders kvpd itself creates in a host's run dir before start are not preconditions.
    managed = list(profile.runtime.fresh_dirs) + list(profile.runtime.dirs)
    for name, h in req.items():
        base = (run_dirs or {}).get(name)
        if base:
            own = {posixpath.normpath(posixpath.join(base, d)) for d in managed}
            h.shared_dirs = [d for d in h.shared_dirs if posixpath.normpath(d) not in own]
    for d in created_on_use:
        users = [h for h in req.values() if d in h.shared_dirs]
        if len(users) == 1:  # one host: nothing to share, and vLLM creates the folder
            users[0].shared_dirs.remove(d)


def build_requirements(
    profile: Profile,
    procs: list[ProcessDraft],
    dram_per_rank: str | None,
    run_dirs: dict[str, str] | None = None,
) -> dict[str, HostRequirements]:
    req: dict[str, _Needs] = {}
    created_on_use: set[str] = set()  # ExampleConnector makes its folder; sharing matters only
    for p in procs:
        h = req.setdefault(p.host, _Needs())
        _add(h.commands, p.argv[0])
        if p.needs is not None:  # stated by whatever made the process (a rehearsal's stand-in)
            _stated_needs(h, p)
        elif p.role in ENGINE_ROLES:
            _engine_needs(profile, h, p, dram_per_rank, created_on_use)
        elif p.role == Role.METASERVICE:
            py = Interpreter(path=p.argv[0])  # the interpreter that runs MetaService
            h.pkg(py, "memcache-hybrid")
            h.pkg(py, "memfabric-hybrid")
    _drop_own_dirs(profile, req, run_dirs, created_on_use)
    return {name: h.freeze() for name, h in req.items()}
