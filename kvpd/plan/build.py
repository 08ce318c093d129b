"""Profile -> Plan. `build_plan` is pure; `load_plan` adds reading the profile file."""

from __future__ import annotations

import hashlib
import posixpath
from typing import Any

from kvpd.errors import ProfileError
from kvpd.plan.bench import bench_spec
from kvpd.plan.bundle import bundle_uses, with_bundle_paths
from kvpd.plan.capacity import memcache_dram_need
from kvpd.plan.container_hosts import with_containers
from kvpd.plan.derived import derived_lines
from kvpd.plan.facts import derive_facts
from kvpd.plan.faults import warnings as fault_warnings
from kvpd.plan.hashseed import pin_hash_seed
from kvpd.plan.kv_owner import mixed_owners
from kvpd.plan.layout import build_layout, host_devices, merged
from kvpd.plan.logchecks import log_checks
from kvpd.plan.plan_files import PlanFiles, config_files, process_specs
from kvpd.plan.processes import ProcessDraft, all_procs
from kvpd.plan.quoting import mask
from kvpd.plan.rehearsal_mode import Rehearsal
from kvpd.plan.rehearse import DEFAULT_ENGINE, engine_named
from kvpd.plan.rehearse import rehearse as rehearse_procs
from kvpd.plan.requirements import build_requirements
from kvpd.plan.rules import check
from kvpd.plan.rules.base import Finding
from kvpd.plan.scenario_check import check_scenarios
from kvpd.plan.sizing import (
    GiB,
    MiB,
    kv_bytes_per_token,
    parse_size,
    round_up,
)
from kvpd.plan.value import (
    HostSpec,
    Plan,
    Sizing,
    SparseSizing,
)
from kvpd.profile.load import Source, load_profile
from kvpd.profile.messages import dotted
from kvpd.profile.roles import Role
from kvpd.profile.schema import Profile
from kvpd.profile.types import transport_of


def host_specs(profile: Profile, base_dir: str | None) -> list[HostSpec]:
    out = []
    for name, h in profile.hosts.items():
        transport = transport_of(h.transport, h.address)
        ssh = profile.ssh.model_dump()
        if h.ssh is not None:
            ssh.update(h.ssh.model_dump(exclude_unset=True))
        run_dir = h.run_dir or profile.runtime.run_dir or f".kvpd/{profile.name}/run"
        if transport == "local" and base_dir and not posixpath.isabs(run_dir):
            run_dir = posixpath.normpath(posixpath.join(base_dir, run_dir))
        out.append(
            HostSpec(
                name=name,
                address=h.address,
                transport=transport,
                user=ssh["user"],
                port=ssh["port"],
                key=ssh["key"],
                known_hosts=ssh["known_hosts"],
                jump=ssh["jump"],
                jump_key=ssh["jump_key"],
                hardware=h.hardware or profile.hardware,
                devices=host_devices(profile, h),
                nic=h.nic,
                run_dir=run_dir,
                bundle_builder=h.bundle_builder,
            )
        )
    return out


def memcache_dram(
    profile: Profile, ranks: int
) -> tuple[str | None, list[tuple[tuple[str, ...], str, bool]]]:
    """dram.size for mmc-local.conf: explicit (aligned as memcache does) or sized from the model.

    Returns (value, findings) where findings are (path, message, is_error).
    """
    mc = profile.kv.memcache
    if mc is None:
        return None, []
    path = ("kv", "memcache", "dram_size")
    device = mc.protocol.startswith("device_")
    align = GiB if device else 2 * MiB
    if mc.dram_size == "auto":
        size = memcache_dram_need(profile, ranks)
        if size is None:
            return None, [
                (
                    path,
                    "auto sizing needs model.layers, the KV shape (kv_heads + "
                    "head_dim, or kv_lora_rank + qk_rope_head_dim), model.max_model_len and "
                    "a group with ascend_store (or kv.memcache.sizing_concurrency); set them "
                    "or give dram_size explicitly (e.g. 10GB).",
                    True,
                )
            ]
        return f"{size // GiB}GB", []
    try:
        n = parse_size(mc.dram_size)
    except ValueError:
        return mc.dram_size, []  # reported by the rules
    aligned = round_up(n, align)
    if aligned != n:
        shown = f"{aligned // GiB}GB" if aligned % GiB == 0 else str(aligned)
        unit = "1 GiB" if device else "2 MiB"
        return shown, [
            (
                path,
                f"{mc.dram_size} is rounded up to {shown} ({mc.protocol} aligns the "
                f"pool to {unit}); write {shown} to make that explicit.",
                False,
            )
        ]
    return mc.dram_size, []


def _validated(
    profile: Profile,
    source: Source,
    findings: list[Finding],
    extra: list[tuple[tuple[str, ...], str, bool]],
) -> list[str]:
    """The warnings, located in the profile's text; raises ProfileError listing every error."""
    errors: list[str] = []
    warnings: list[str] = []
    for f in findings:
        (errors if f.error else warnings).append(
            f"{source.where(f.path)}: {dotted(f.path)}: {f.message}"
        )
    for path, msg, is_err in extra:
        (errors if is_err else warnings).append(f"{source.where(path)}: {dotted(path)}: {msg}")
    if errors:
        raise ProfileError(errors)
    return warnings


def _digest(source: Source, files: PlanFiles, secrets: list[str]) -> str:
    # Over the redacted text: the digest is shown (plan, state, status) and would let anyone
    # who sees it test guesses of a short secret. A change of a secret alone keeps the digest.
    digested = source.text + "".join(f.content for f in files.files.values())
    for s in sorted(secrets, key=len, reverse=True):
        digested = digested.replace(s, "****")
    return hashlib.sha256(digested.encode()).hexdigest()[:16]


def _proxy_url(profile: Profile, procs: list[ProcessDraft], by_host: dict[str, HostSpec]) -> str:
    """Where clients send requests: the proxy, else the first mixed engine."""
    if profile.proxy is not None:
        return f"http://{by_host[profile.proxy.host].address}:{profile.proxy.port}"
    if profile.mixed is not None:
        first = next(p for p in procs if p.role == Role.MIXED)
        return f"http://{by_host[first.host].address}:{first.ports[0][0]}"
    return ""


def build_plan(
    profile: Profile,
    source: Source,
    *,
    rehearse: bool | str = False,
    base_dir: str | None = None,
) -> Plan:
    """Validate, derive and render. Raises ProfileError listing every error with its line.

    `rehearse` (True, or a rehearsal engine's name) rehearses the validated real deployment:
    one transform of its processes (`kvpd.plan.rehearse`)."""
    rehearsal = Rehearsal.of(rehearse, DEFAULT_ENGINE)
    profile = _resolve_local_paths(profile, base_dir)
    layout = build_layout(profile)
    procs = pin_hash_seed(profile, all_procs(profile, layout))
    facts = derive_facts(profile, layout, procs)
    findings = check(facts)
    notes: dict[str, str] = {}
    if rehearsal.engine is not None:
        # The rehearsal runs on other hardware: what the rules say about the real one is moot.
        findings = [f for f in findings if not f.on_hardware]
        rehearsed = rehearse_procs(profile, procs, engine_named(rehearsal.engine))
        procs, notes = rehearsed.procs, rehearsed.notes
    bundle = bundle_uses(profile, procs, rehearsal)  # node bundle: who imports kvpd
    procs = with_bundle_paths(procs, bundle)
    dram, extra = memcache_dram(profile, facts.memcache_ranks)
    warnings = _validated(profile, source, findings, extra)

    hosts = host_specs(profile, base_dir)
    by_host = {h.name: h for h in hosts}
    files = config_files(profile, procs, by_host, dram or "")
    processes, ports = process_specs(profile, procs, layout, notes, rehearsal, files)
    secrets = sorted({v for p in procs for k, v in p.env if v and mask(k, v) != v})
    model = profile.model
    requirements = build_requirements(profile, procs, dram, {h.name: h.run_dir for h in hosts})
    # Containers: hosts whose processes run inside one (kvpd.plan.container).
    hosts = with_containers(profile, hosts, processes, requirements, rehearsal)
    if owners := mixed_owners(hosts, requirements):  # one login user per shared KV folder
        raise ProfileError([f"{source.where(('ssh', 'user'))}: ssh.user: {m}" for m in owners])
    return Plan(
        deployment=profile.name,
        profile_digest=_digest(source, files, secrets),
        hosts=tuple(hosts),
        files=tuple(files.files.values()),
        processes=tuple(processes),
        ports=tuple(sorted(ports, key=lambda u: (u.host, u.port))),
        warnings=(*warnings, *fault_warnings(processes)),
        proxy_url=_proxy_url(profile, procs, by_host),
        served_model=model.served_name or model.path,
        tokenizer=model.tokenizer or model.path,
        bench=bench_spec(profile.bench),
        rehearsal=rehearsal.on,
        fresh_dirs=tuple(profile.runtime.fresh_dirs),
        made_dirs=tuple(profile.runtime.dirs),
        sizing=_sizing(profile),
        secret_values=tuple(secrets),
        requirements=requirements,
        bundle=bundle,
        log_checks=log_checks(facts, procs, rehearsal),
        derived=derived_lines(profile, layout, facts.memcache_ranks, dram),
        client_key_file=(profile.proxy.client_key_file or "") if profile.proxy else "",
        lease_s=profile.runtime.lease_s,
    )


def _sizing(profile: Profile) -> Sizing:
    d, m = profile.decode, profile.model
    sparse = None
    if d is not None and d.sparse_offload is not None and d.sparse_offload.enabled:
        opts = merged(profile, d)
        sparse = SparseSizing(
            topk_buffer_size=d.sparse_offload.topk_buffer_size,
            index_topk=m.index_topk,
            kv_lora_rank=m.kv_lora_rank,
            qk_rope_head_dim=m.qk_rope_head_dim,
            layers=m.layers,
            block_size=opts.block_size or m.block_size,
            max_model_len=opts.max_model_len or m.max_model_len,
            rows=opts.max_num_seqs or 16,
        )
    return Sizing(kv_bytes_per_token=kv_bytes_per_token(profile.model) or None, sparse=sparse)


def _resolve_local_paths(profile: Profile, base_dir: str | None) -> Profile:
    """When every host is this machine, relative data paths mean: relative to `base_dir` (the
    directory kvpd runs in), not to each process's run directory."""
    if not base_dir or not all(
        transport_of(h.transport, h.address) == "local" for h in profile.hosts.values()
    ):
        return profile

    def absolute(p: str | None) -> str | None:
        if not p or posixpath.isabs(p) or p.startswith(("~", "$")):  # "": a rule's
            return p
        return posixpath.normpath(posixpath.join(base_dir, p))

    m = profile.model
    model = m.model_copy(update={"path": absolute(m.path), "tokenizer": absolute(m.tokenizer)})
    kv = profile.kv
    upd: dict[str, Any] = {"example_path": absolute(kv.example_path)}
    if kv.kvpd_store is not None:
        upd["kvpd_store"] = kv.kvpd_store.model_copy(update={"path": absolute(kv.kvpd_store.path)})
    if kv.ucm is not None:
        upd["ucm"] = kv.ucm.model_copy(update={"storage": absolute(kv.ucm.storage)})
    return profile.model_copy(update={"model": model, "kv": kv.model_copy(update=upd)})


def load_plan(
    profile_arg: str,
    *,
    rehearse: bool | str = False,
    base_dir: str | None = None,
    sets: list[str] | None = None,
    inventory: str | None = None,
    scenarios: bool = True,
) -> Plan:
    """Read PROFILE (path or bundled name) and build its plan; with `scenarios`, also build
    each bench scenario (a verb that only needs the deployment's name skips that)."""
    import os

    profile, source = load_profile(profile_arg, sets=sets or [], inventory=inventory)
    base = base_dir if base_dir is not None else os.getcwd()
    plan = build_plan(profile, source, rehearse=rehearse, base_dir=base)
    if not scenarios:
        return plan

    def build(more: list[str]) -> Plan:
        p, src = load_profile(profile_arg, sets=more, inventory=inventory)
        return build_plan(p, src, rehearse=rehearse, base_dir=base)

    check_scenarios(profile, source, list(sets or []), build)
    return plan
