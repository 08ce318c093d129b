"""Attach each host's `ContainerSpec` to its `HostSpec` (pure; part of `build_plan`)."""

from __future__ import annotations

import dataclasses
import posixpath

from kvpd.plan.container import container_spec
from kvpd.plan.rehearsal_mode import Rehearsal
from kvpd.plan.value import HostRequirements, HostSpec, ProcessSpec
from kvpd.profile.container_schema import Container
from kvpd.profile.schema import Profile


def _absolute(paths: list[str]) -> tuple[str, ...]:
    out: list[str] = []
    for p in paths:
        if p and posixpath.isabs(p):
            p = posixpath.normpath(p)
            if p not in out:
                out.append(p)
    return tuple(out)


def data_dirs(profile: Profile, rehearsal: Rehearsal) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Absolute folders the engines use outside the run dir, mounted at the same path inside:
    (read only: the model and the tokenizer, which an engine never writes; read-write: KV
    storage)."""
    m, kv = profile.model, profile.kv
    models = [profile.rehearsal.model] if rehearsal.on else [m.path, m.tokenizer or m.path]
    paths = [kv.example_path or "", profile.rehearsal.storage if rehearsal.on else ""]
    if kv.ucm is not None:
        paths.append(kv.ucm.storage)
    if kv.kvpd_store is not None:
        paths.append(kv.kvpd_store.path)
    writable = _absolute(paths)
    return tuple(d for d in _absolute(models) if d not in writable), writable


def host_container(profile: Profile, host: str) -> Container | None:
    """The host's own `container`, else the one of a group placed on it (the rules make sure
    groups sharing a host agree)."""
    own = profile.hosts[host].container
    if own is not None:
        return own
    for g in (profile.prefill, profile.decode, profile.mixed):
        if g is not None and g.container is not None and host in g.hosts:
            return g.container
    return None


def with_containers(
    profile: Profile,
    hosts: list[HostSpec],
    processes: list[ProcessSpec],
    requirements: dict[str, HostRequirements],
    rehearsal: Rehearsal,
) -> list[HostSpec]:
    """`hosts`, each with the container its profile entry asks for (devices: the NPUs the plan
    assigns to that host's processes; --shm-size: what its requirements size)."""
    out = []
    for h in hosts:
        c = host_container(profile, h.name)
        if c is None:
            out.append(h)
            continue
        npus = tuple(d for p in processes if p.host == h.name for d in p.devices)
        req = requirements.get(h.name)
        spec = container_spec(
            c,
            deployment=profile.name,
            hardware="cpu" if rehearsal.on else h.hardware,  # rehearsals run on CPUs
            npus=npus,
            shm_needed_gb=req.shm_gb if req else 0.0,
            run_dir=h.run_dir,
            data_dirs=data_dirs(profile, rehearsal),
        )
        out.append(dataclasses.replace(h, container=spec))
    return out
