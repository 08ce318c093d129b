"""Profile -> Plan. `build_plan` is pure; `load_plan` adds reading the profile file."""

from __future__ import annotations

import hashlib
import posixpath
from typing import Any

from kvpd.errors import ProfileError
from kvpd.plan import configfiles, kvconfig, supervision
from kvpd.plan.bench import bench_spec
from kvpd.plan.bundle import bundle_uses, with_bundle_paths
from kvpd.plan.capacity import POOL_INIT_S_PER_GB, memcache_dram_need
from kvpd.plan.container_hosts import with_containers
from kvpd.plan.derived import derived_lines
from kvpd.plan.facts import derive_facts
from kvpd.plan.faults import warnings as fault_warnings
from kvpd.plan.hashseed import pin_hash_seed
from kvpd.plan.layout import build_layout, host_devices, merged
from kvpd.plan.logchecks import log_checks
from kvpd.plan.lognames import log_file
from kvpd.plan.processes import ProcessDraft, all_procs
from kvpd.plan.quoting import mask
from kvpd.plan.rehearse import DEFAULT_ENGINE, engine_named
from kvpd.plan.rehearse import rehearse as rehearse_procs
from kvpd.plan.render import launch_script
from kvpd.plan.requirements import build_requirements
from kvpd.plan.rules import check
from kvpd.plan.scenario_check import check_scenarios
from kvpd.plan.sizing import (
    GiB,
    MiB,
    kv_bytes_per_token,
    parse_size,
    round_up,
)
from kvpd.plan.value import (
    FileSpec,
    HealthCheck,
    HostSpec,
    Plan,
    PortUse,
    ProcessSpec,
    Sizing,
    SparseSizing,
)
from kvpd.profile.load import Source, load_profile
from kvpd.profile.messages import dotted
from kvpd.profile.schema import Group, Profile

LOCAL_ADDRESSES = ("127.0.0.1", "localhost", "::1")


def host_specs(profile: Profile, base_dir: str | None) -> list[HostSpec]:
    out = []
    for name, h in profile.hosts.items():
        transport = h.transport or ("local" if h.address in LOCAL_ADDRESSES else "ssh")
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
    profile = _resolve_local_paths(profile, base_dir)
    layout = build_layout(profile)
    procs = pin_hash_seed(profile, all_procs(profile, layout))
    facts = derive_facts(profile, layout, procs)
    findings = check(facts)
    notes: dict[str, str] = {}
    if rehearse:
        # The rehearsal runs on other hardware: what the rules say about the real one is moot.
        findings = [f for f in findings if not f.on_hardware]
        engine = engine_named(DEFAULT_ENGINE if rehearse is True else rehearse)
        rehearsed = rehearse_procs(profile, procs, engine)
        procs, notes = rehearsed.procs, rehearsed.notes
    bundle = bundle_uses(profile, procs, bool(rehearse))  # node bundle: who imports kvpd
    procs = with_bundle_paths(procs, bundle)
    dram, extra = memcache_dram(profile, facts.memcache_ranks)
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

    hosts = host_specs(profile, base_dir)
    by_host = {h.name: h for h in hosts}
    files: dict[tuple[str, str], FileSpec] = {}

    def put(host: str, path: str, content: str, template: str, mode: int = 0o644) -> None:
        files[(host, path)] = FileSpec(
            host=host, path=path, content=content, mode=mode, template=template
        )

    mc = profile.kv.memcache
    for p in procs:
        for fpath in p.files:
            if fpath == kvconfig.MMC_META and mc is not None:
                text = configfiles.memcache_meta(mc, by_host[mc.host].address, profile.name)
                put(p.host, fpath, text, "mmc-meta.conf")
            elif fpath == kvconfig.MMC_LOCAL and mc is not None:
                meta = by_host[mc.host].address
                h = profile.hosts[p.host]
                local = h.ip or h.address
                text = configfiles.memcache_local(mc, meta, dram or "", profile.name, p.host, local)
                put(p.host, fpath, text, "mmc-local.conf")
            elif fpath == kvconfig.MOONCAKE_CONFIG and profile.kv.mooncake is not None:
                mk = profile.kv.mooncake
                text = configfiles.mooncake_json(
                    mk.metadata_server,
                    mk.protocol,
                    mk.device_name,
                    f"{configfiles.url_host(by_host[mk.host].address)}:{mk.port}",
                    mk.global_segment_size,
                )
                put(p.host, fpath, text, "mooncake.json")
            elif fpath == kvconfig.ucm_config_path(profile) and profile.kv.ucm is not None:
                put(p.host, fpath, configfiles.ucm_yaml(profile.kv.ucm, profile.name), "ucm.yaml")

    processes: list[ProcessSpec] = []
    ports: list[PortUse] = []
    secrets = sorted({v for p in procs for k, v in p.env if v and mask(k, v) != v})
    engine_procs = {ep.name: ep for ep in layout.procs}
    for p in procs:
        script = f"{p.name}/launch.sh"
        ep = engine_procs.get(p.name)
        log = log_file(getattr(profile, ep.role).log_name, ep) if ep else f"logs/{p.name}.log"
        secret = any(mask(k, v) != v for k, v in p.env)
        put(
            p.host,
            script,
            launch_script(
                p, profile.name, log, profile.runtime.dirs, _supervisor(profile, p, bool(rehearse))
            ),
            "launch.sh.j2",
            0o700 if secret else 0o755,
        )
        processes.append(
            ProcessSpec(
                name=p.name,
                host=p.host,
                role=p.role,
                stage=p.stage,
                script=script,
                command=p.argv,
                env=tuple((k, mask(k, v)) for k, v in p.env),
                log=log,
                ports=tuple(port for port, _ in p.ports),
                health=HealthCheck(
                    url=p.health_url,
                    timeout_s=_health_timeout(profile, p),
                    ready_port=p.ready[0] if p.ready else None,
                    ready_log=p.ready[1] if p.ready else "",
                ),
                devices=p.devices,
                substituted=notes.get(p.name, ""),
            )
        )
        ports += [
            PortUse(host=p.host, port=port, owner=p.name, purpose=why) for port, why in p.ports
        ]

    # Over the redacted text: the digest is shown (plan, state, status) and would let anyone
    # who sees it test guesses of a short secret. A change of a secret alone keeps the digest.
    digested = source.text + "".join(f.content for f in files.values())
    for s in sorted(secrets, key=len, reverse=True):
        digested = digested.replace(s, "****")
    digest = hashlib.sha256(digested.encode()).hexdigest()[:16]
    proxy_url = ""
    if profile.proxy is not None:
        proxy_url = f"http://{by_host[profile.proxy.host].address}:{profile.proxy.port}"
    elif profile.mixed is not None:
        first = next(p for p in procs if p.role == "mixed")
        proxy_url = f"http://{by_host[first.host].address}:{first.ports[0][0]}"
    model = profile.model
    requirements = build_requirements(profile, procs, dram, {h.name: h.run_dir for h in hosts})
    # Containers: hosts whose processes run inside one (kvpd.plan.container).
    hosts = with_containers(profile, hosts, processes, requirements, rehearse=bool(rehearse))
    return Plan(
        deployment=profile.name,
        profile_digest=digest,
        hosts=tuple(hosts),
        files=tuple(files.values()),
        processes=tuple(processes),
        ports=tuple(sorted(ports, key=lambda u: (u.host, u.port))),
        warnings=(*warnings, *fault_warnings(processes)),
        proxy_url=proxy_url,
        served_model=model.served_name or model.path,
        tokenizer=model.tokenizer or model.path,
        bench=bench_spec(profile.bench),
        rehearsal=bool(rehearse),
        fresh_dirs=tuple(profile.runtime.fresh_dirs),
        made_dirs=tuple(profile.runtime.dirs),
        sizing=_sizing(profile),
        secret_values=tuple(secrets),
        requirements=requirements,
        bundle=bundle,
        log_checks=log_checks(facts, procs, bool(rehearse)),
        derived=derived_lines(profile, layout, facts.memcache_ranks, dram),
        client_key_file=(profile.proxy.client_key_file or "") if profile.proxy else "",
        lease_s=profile.runtime.lease_s,
    )


def _supervisor(profile: Profile, p: ProcessDraft, rehearse: bool) -> tuple[str, ...]:
    pol = supervision.policy_for(profile, p.role)
    if pol is None:
        return ()
    python = supervision.python_for(profile, rehearse)
    return supervision.supervisor_argv(python, p.name, pol, p.health_url)


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
        (h.transport or ("local" if h.address in LOCAL_ADDRESSES else "ssh")) == "local"
        for h in profile.hosts.values()
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


def _health_timeout(profile: Profile, p: ProcessDraft) -> float:
    if p.health_timeout_s is not None:
        return p.health_timeout_s
    if p.role in ("metaservice", "mooncake", "proxy"):
        return min(120.0, profile.runtime.health_timeout_s)
    base = profile.runtime.health_timeout_s
    group: Group | None = getattr(profile, p.role, None)
    if group is None:
        return base
    if group.health_timeout_s is not None:
        return group.health_timeout_s
    so = group.sparse_offload
    if so is not None and so.enabled:
        ranks = max(1, len(p.devices) // max(1, group.tp * group.pp))
        return base + POOL_INIT_S_PER_GB * so.dram_size_per_dp_gb * ranks
    return base


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
