"""The files and process specs of a plan (pure): config files rendered from the profile, and
each process's launch script, log, ports and health check."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvpd.plan import configfiles, kvconfig, supervision
from kvpd.plan.capacity import POOL_INIT_S_PER_GB
from kvpd.plan.layout import Layout
from kvpd.plan.lognames import log_file
from kvpd.plan.processes import ProcessDraft
from kvpd.plan.quoting import mask
from kvpd.plan.rehearsal_mode import Rehearsal
from kvpd.plan.render import launch_script
from kvpd.plan.value import FileSpec, HealthCheck, HostSpec, PortUse, ProcessSpec
from kvpd.profile.roles import NON_ENGINE_ROLES
from kvpd.profile.schema import Group, Profile


@dataclass
class PlanFiles:
    """Every file to write on the hosts, by (host, path)."""

    files: dict[tuple[str, str], FileSpec] = field(default_factory=dict)

    def put(self, host: str, path: str, content: str, template: str, mode: int = 0o644) -> None:
        self.files[(host, path)] = FileSpec(
            host=host, path=path, content=content, mode=mode, template=template
        )


def _config_text(
    profile: Profile, p: ProcessDraft, fpath: str, by_host: dict[str, HostSpec], dram: str
) -> tuple[str, str] | None:
    """(content, template) of the config file `fpath` that process `p` reads."""
    kv = profile.kv
    mc = kv.memcache
    if fpath == kvconfig.MMC_META and mc is not None:
        text = configfiles.memcache_meta(mc, by_host[mc.host].address, profile.name)
        return text, "mmc-meta.conf"
    if fpath == kvconfig.MMC_LOCAL and mc is not None:
        meta = by_host[mc.host].address
        h = profile.hosts[p.host]
        local = h.ip or h.address
        text = configfiles.memcache_local(mc, meta, dram, profile.name, p.host, local)
        return text, "mmc-local.conf"
    if fpath == kvconfig.MOONCAKE_CONFIG and kv.mooncake is not None:
        mk = kv.mooncake
        text = configfiles.mooncake_json(
            mk.metadata_server,
            mk.protocol,
            mk.device_name,
            f"{configfiles.url_host(by_host[mk.host].address)}:{mk.port}",
            mk.global_segment_size,
        )
        return text, "mooncake.json"
    if fpath == kvconfig.ucm_config_path(profile) and kv.ucm is not None:
        return configfiles.ucm_yaml(kv.ucm, profile.name), "ucm.yaml"
    return None


def config_files(
    profile: Profile, procs: list[ProcessDraft], by_host: dict[str, HostSpec], dram: str
) -> PlanFiles:
    """The config files the processes read, rendered for each process's host."""
    out = PlanFiles()
    for p in procs:
        for fpath in p.files:
            rendered = _config_text(profile, p, fpath, by_host, dram)
            if rendered is not None:
                out.put(p.host, fpath, *rendered)
    return out


def _supervisor(profile: Profile, p: ProcessDraft, rehearsal: Rehearsal) -> tuple[str, ...]:
    pol = supervision.policy_for(profile, p.role)
    if pol is None:
        return ()
    python = supervision.python_for(profile, rehearsal)
    return supervision.supervisor_argv(python, p.name, pol, p.health_url)


def _health_timeout(profile: Profile, p: ProcessDraft) -> float:
    if p.health_timeout_s is not None:
        return p.health_timeout_s
    if p.role in NON_ENGINE_ROLES:
        return min(120.0, profile.runtime.health_timeout_s)
    base = profile.runtime.health_timeout_s
    group: Group | None = profile.group(p.role)
    if group is None:
        return base
    if group.health_timeout_s is not None:
        return group.health_timeout_s
    so = group.sparse_offload
    if so is not None and so.enabled:
        ranks = max(1, len(p.devices) // max(1, group.tp * group.pp))
        return base + POOL_INIT_S_PER_GB * so.dram_size_per_dp_gb * ranks
    return base


def _spec(profile: Profile, p: ProcessDraft, script: str, log: str, note: str) -> ProcessSpec:
    return ProcessSpec(
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
        substituted=note,
    )


def process_specs(
    profile: Profile,
    procs: list[ProcessDraft],
    layout: Layout,
    notes: dict[str, str],
    rehearsal: Rehearsal,
    files: PlanFiles,
) -> tuple[list[ProcessSpec], list[PortUse]]:
    """Each process's spec and the ports it holds; its launch script goes into `files`
    (0700 when its environment holds a secret)."""
    processes: list[ProcessSpec] = []
    ports: list[PortUse] = []
    engine_procs = {ep.name: ep for ep in layout.procs}
    for p in procs:
        script = f"{p.name}/launch.sh"
        ep = engine_procs.get(p.name)
        group = profile.group(ep.role) if ep else None
        log = log_file(group.log_name, ep) if group and ep else f"logs/{p.name}.log"
        secret = any(mask(k, v) != v for k, v in p.env)
        text = launch_script(
            p, profile.name, log, profile.runtime.dirs, _supervisor(profile, p, rehearsal)
        )
        files.put(p.host, script, text, "launch.sh.j2", 0o700 if secret else 0o755)
        processes.append(_spec(profile, p, script, log, notes.get(p.name, "")))
        ports += [
            PortUse(host=p.host, port=port, owner=p.name, purpose=why) for port, why in p.ports
        ]
    return processes, ports
