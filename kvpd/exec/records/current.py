"""The deployment as its hosts record it: what every verb acts on.

All host records of the plan are read in parallel and validated against the plan built from
the profile now (validate.py). The local cache (state.json) is merged in only for hosts that
could not be asked, and only after passing the very same validation, so a tampered cache is
worth no more than a tampered record. The result is a DeploymentState whose plan is the plan
given (commands, scripts, hosts: never from a record or the cache) and whose processes are
the validated records, plus what differs from the profile given (drift).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvpd.exec.fanout import Fanout
from kvpd.exec.records import hostio
from kvpd.exec.records.model import HostRecord, launch_digest
from kvpd.exec.records.validate import RecordRefused, parse
from kvpd.exec.records.writer import host_record
from kvpd.exec.state import DeploymentState, ProcessRecord
from kvpd.exec.transport import Transports
from kvpd.plan.value import Plan


@dataclass
class Drift:
    """What runs differs from the profile given: other plan digests, and the processes whose
    launch (command, env, script) differs."""

    running_digests: list[str] = field(default_factory=list)
    processes: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.running_digests or self.processes)

    def line(self, plan: Plan) -> str:
        if not self:
            return ""
        procs = ", ".join(self.processes) or "none"
        return (
            f"drift: what runs was planned from a different profile (plan "
            f"{', '.join(self.running_digests)}; the profile given plans {plan.profile_digest}); "
            f"processes launched differently: {procs}. `kvpd restart` refuses those; "
            "`kvpd down` then `kvpd up` runs what the profile says now."
        )


@dataclass
class Current:
    """The state from the hosts' records, and what could not be read or trusted."""

    state: DeploymentState
    drift: Drift
    refused: dict[str, str] = field(default_factory=dict)  # host -> why its record was refused
    unreachable: dict[str, str] = field(default_factory=dict)  # host -> error
    from_hosts: bool = True
    # Set by `status`: sessions with the deployment's marks that no record names, and the hosts
    # that could not be asked for them (exec/processes/sweep.py).
    unrecorded: list[ProcessRecord] = field(default_factory=list)
    unasked: list[str] = field(default_factory=list)

    @property
    def problems(self) -> list[str]:
        return [*self.refused.values(), *(f"{h}: unreachable ({e})"
                                          for h, e in self.unreachable.items())]  # fmt: skip


def _hosts(plan: Plan) -> list[str]:
    return sorted({p.host for p in plan.processes})


def read_one(transports: Transports, plan: Plan, host: str) -> HostRecord | None:
    path = hostio.record_path(plan, host)
    raw = hostio.read_raw(transports[host], path)
    return None if raw is None else parse(raw, plan, host, path)


def _from_cache(cache: DeploymentState | None, plan: Plan, host: str) -> HostRecord | None:
    """The cache's record of `host`, validated exactly as a host's own record is."""
    if cache is None or cache.deployment != plan.deployment:
        return None
    rec = host_record(cache, host)
    if rec is None:
        return None
    try:
        return parse(rec.to_bytes(), plan, host, f"the cached state of {host}")
    except RecordRefused:
        return None


def _processes(records: dict[str, HostRecord]) -> list[ProcessRecord]:
    out = [
        ProcessRecord(name=p.name, host=h, stage=p.stage, pid=p.pid, pgid=p.pgid,
                      start_ticks=p.start_ticks, ports=list(p.ports), log=p.log,
                      started_at=p.started_at, status=p.status, role=p.role,
                      devices=list(p.devices), launch_digest=p.launch_digest)
        for h, r in records.items() for p in r.processes
    ]  # fmt: skip
    return sorted(out, key=lambda r: (r.stage, r.name))


def drift(plan: Plan, records: dict[str, HostRecord]) -> Drift:
    digests = sorted({r.plan_digest for r in records.values()} - {plan.profile_digest})
    differ = [
        p.name
        for r in records.values()
        for p in r.processes
        if p.launch_digest != launch_digest(plan, plan.process(p.name))
    ]
    return Drift(digests, sorted(differ))


def read_current(
    plan: Plan, transports: Transports, cache: DeploymentState | None, workers: int = 16
) -> Current:
    """Read every host's record of `plan` in parallel (see the module docstring)."""
    hosts = _hosts(plan)
    with Fanout(min(workers, max(1, len(hosts)))) as fan:
        outcomes = fan.each(lambda h: read_one(transports, plan, h), hosts, key=str)
    records: dict[str, HostRecord] = {}
    cur = Current(DeploymentState(plan.deployment, plan.profile_digest, plan), Drift())
    for h, o in outcomes.items():
        if isinstance(o.error, RecordRefused):
            cur.refused[h] = str(o.error)
        elif o.error is not None:
            cur.unreachable[h] = str(o.error)
            cached = _from_cache(cache, plan, h)
            if cached is not None:
                records[h] = cached
        elif o.value is not None:
            records[h] = o.value
    _fill(cur.state, records, cache)
    cur.drift = drift(plan, records)
    return cur


def _fill(
    state: DeploymentState, records: dict[str, HostRecord], cache: DeploymentState | None
) -> None:
    state.processes = _processes(records)
    state.run_dirs = {h: r.run_dir for h, r in records.items()}
    first = min(records.values(), key=lambda r: r.started_at, default=None)
    if cache is not None and cache.deployment == state.deployment:
        state.recipe, state.bundle, state.profile = cache.recipe, cache.bundle, cache.profile
    if first is not None:
        state.started_by, state.created_at = first.started_by, first.started_at
        state.profile_digest = first.plan_digest
        state.status = cache.status if cache is not None and cache.status != "down" else "up"
    else:
        state.status = "down"
