"""Other kvpd deployments on this plan's hosts: who holds its ports, devices or run dirs.

Found through each host's index (hostio.py). Another deployment's record is only read, never
acted on, so it is parsed leniently (a malformed entry is skipped), and a process counts as
holding something only while it is alive with its recorded start time (a stale record of a
deployment whose host rebooted blocks nothing).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from kvpd.exec.fanout import Fanout
from kvpd.exec.records import hostio
from kvpd.exec.records.validate import PID_MAX, decode
from kvpd.exec.transport import Transport, Transports
from kvpd.plan.value import Plan


@dataclass(frozen=True)
class Foreign:
    """A process another deployment's record names on a host."""

    deployment: str
    owner: str  # "'name' (started by user@host at time)"
    run_dir: str
    process: str
    pid: int
    start_ticks: int
    ports: frozenset[int]
    devices: frozenset[int]


def _ints(v: object) -> frozenset[int]:
    if not isinstance(v, list):
        return frozenset()
    return frozenset(x for x in v if isinstance(x, int) and not isinstance(x, bool))


def _owner(d: dict[str, object], name: str) -> str:
    by = d.get("started_by") if isinstance(d.get("started_by"), str) else "someone"
    at = d.get("started_at")
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at)) if isinstance(
        at, int | float) and 0 <= at < 1e11 else "an unknown time"  # fmt: skip
    return f"{name!r} (started by {str(by)[:100]} at {when})"


def foreign(name: str, run_dir: str, raw: bytes) -> list[Foreign]:
    """The processes `raw` (an indexed record) names; [] for anything that is not a record."""
    d = decode(raw) if raw else "empty"
    if isinstance(d, str) or d.get("deployment") != name:
        return []
    if not isinstance(d.get("processes"), list):
        return []
    out = []
    for p in d["processes"]:
        if not isinstance(p, dict):
            continue
        pid, ticks = p.get("pid"), p.get("start_ticks")
        if not isinstance(pid, int) or not 1 < pid <= PID_MAX:
            continue
        if not isinstance(ticks, int) or ticks <= 0:
            continue
        out.append(Foreign(name, _owner(d, name), run_dir, str(p.get("name"))[:100], pid, ticks,
                           _ints(p.get("ports")), _ints(p.get("devices"))))  # fmt: skip
    return out


def live_foreign(t: Transport) -> list[Foreign]:
    """Every live process the host's indexed records name (any deployment)."""
    found = [f for n, d, raw in hostio.list_indexed(t) for f in foreign(n, d, raw)]
    return [f for f in found if t.alive(f.pid, start_ticks=f.start_ticks)]


def port_holders(t: Transport, ports: list[int]) -> dict[int, str]:
    """For each of `ports` a live kvpd process holds: "prefill-0 of kvpd deployment ..."."""
    out: dict[int, str] = {}
    for f in live_foreign(t):
        for port in sorted(f.ports & set(ports)):
            out[port] = f"{f.process} of kvpd deployment {f.owner}"
    return out


def _held(f: Foreign, ports: set[int], devices: set[int], run_dir: str, name: str) -> str:
    """What `f` holds of a plan's ports, devices and run dir on one host ("" if nothing). The
    plan's own deployment in its very run dir is running already; the same name elsewhere
    (another checkout) is in the way only through ports or devices, like any other."""
    if f.deployment == name and f.run_dir == run_dir:
        return f"runs {f.process} already (deployment {f.owner})"
    held = []
    if f.ports & ports:
        held.append(f"ports {', '.join(map(str, sorted(f.ports & ports)))}")
    if f.devices & devices:
        held.append(f"devices {', '.join(map(str, sorted(f.devices & devices)))}")
    if f.run_dir == run_dir:
        held.append(f"the run dir {run_dir}")
    return f"{'; '.join(held)} ({f.process} of kvpd deployment {f.owner})" if held else ""


def _exclusive_devices(plan: Plan, host: str) -> set[int]:
    """The devices of `host` one process holds alone: accelerators (NPUs, GPUs). A CPU
    host's devices are cores its engines bind their OpenMP threads to
    (VLLM_CPU_OMP_THREADS_BIND), which two deployments may share (slower, not wrong), so
    they are nobody's to refuse."""
    if plan.host(host).hardware == "cpu":
        return set()
    return {d for s in plan.processes if s.host == host for d in s.devices}


def _host_conflicts(plan: Plan, t: Transport, host: str) -> list[str]:
    ports = {p for s in plan.processes if s.host == host for p in s.ports}
    ports |= {u.port for u in plan.ports if u.host == host}
    devices = _exclusive_devices(plan, host)
    run_dir = t.resolve(plan.host(host).run_dir)
    out = []
    for f in live_foreign(t):
        line = _held(f, ports, devices, run_dir, plan.deployment)
        if line:
            out.append(f"{host}: {line}")
    return out


def conflicts(plan: Plan, transports: Transports, workers: int = 16) -> list[str]:
    """One line per host and live process of a deployment in this plan's way ([] if none)."""
    hosts = sorted({p.host for p in plan.processes})
    with Fanout(min(workers, max(1, len(hosts)))) as fan:
        outcomes = fan.each(lambda h: _host_conflicts(plan, transports[h], h), hosts, key=str)
    return [line for o in outcomes.values() if o.value for line in o.value]
