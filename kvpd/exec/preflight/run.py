"""Preflight: read-only checks on every host of a plan, one table with a fix hint per failure.

It verifies what `Plan.requirements` lists (derived by the planner): the host is reachable and
its key known; packages importable with versions identical across hosts; commands and model
paths present; the plan's ports free; NPUs visible; Clang + OpenMP where vLLM-Ascend's sparse
planner will be JIT-built (also where kvpd's plugin will not recognise the installed manager);
shared storage really shared (a token written on one host must be read on the others); enough
free memory and /dev/shm.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvpd.errors import KvpdError
from kvpd.exec.bundle import preflight as bundle_preflight
from kvpd.exec.containers import preflight as container_preflight
from kvpd.exec.fanout import Fanout, HostOutcome
from kvpd.exec.preflight.channels import channel_checks
from kvpd.exec.preflight.checks import Check
from kvpd.exec.preflight.owners import owner_checks
from kvpd.exec.preflight.pinned_versions import pinned_checks
from kvpd.exec.preflight.planner_gate import planner_checks
from kvpd.exec.preflight.probe import PROBE
from kvpd.exec.preflight.verdict import Versions, judge_hosts, version_mismatches
from kvpd.exec.records.conflicts import port_holders
from kvpd.exec.transport import Transport
from kvpd.plan.value import Plan


def _probe(t: Transport, req: dict[str, Any]) -> dict[str, Any]:
    r = t.run(["python3", "-c", PROBE, json.dumps(req)], timeout_s=180)
    if not r.ok:
        raise KvpdError(f"probe failed (exit {r.exit_code}): {r.stderr.strip()[-300:]}")
    data: dict[str, Any] = json.loads(r.stdout)
    return data


def run_checks(plan: Plan, transports: Callable[[str], Transport]) -> list[Check]:
    """Probe every host in parallel (twice where storage must be shared) and judge the results."""
    hosts = [h.name for h in plan.hosts if h.name in plan.requirements]
    ports = {h: sorted({u.port for u in plan.ports if u.host == h}) for h in hosts}
    sharing: dict[str, list[str]] = {}
    for h in hosts:
        for d in plan.requirements[h].shared_dirs:
            sharing.setdefault(d, []).append(h)
    # Containers on the nodes first: their runtime, state, image and the run dir mount.
    checks: list[Check] = container_preflight.preflight_checks(plan, transports)
    results = _probe_hosts(_Probes(plan, transports, hosts, ports, sharing))
    verdict = judge_hosts(
        plan.requirements, results, ports, sharing, lambda h, busy: busy_detail(transports(h), busy)
    )
    checks += verdict.checks
    checks += _reached_checks(plan, transports, verdict.versions, checks)
    checks += version_mismatches(verdict.versions)
    if plan.bundle:  # node bundle: each slot's Python, pip, disk, native core per platform
        checks += bundle_preflight.preflight_checks(plan, transports)
    return checks


@dataclass(frozen=True)
class _Probes:
    """What one preflight's probe rounds share: the hosts, their ports and shared directories,
    and one token every host writes and its peers look for."""

    plan: Plan
    transports: Callable[[str], Transport]
    hosts: list[str]
    ports: dict[str, list[int]]
    sharing: dict[str, list[str]]
    token: str = field(default_factory=lambda: secrets.token_hex(6))

    def request(self, h: str, write: bool, cleanup: bool, full: bool) -> dict[str, Any]:
        need = self.plan.requirements[h]
        peers = sorted({p for d in need.shared_dirs for p in self.sharing[d] if p != h})
        req: dict[str, Any] = {"shared_dirs": list(need.shared_dirs)}
        if full:  # later rounds only look at the shared directories
            req.update(
                packages=[
                    {"path": p.python.path, "next_to": p.python.next_to, "names": list(p.names)}
                    for p in need.packages
                ],
                commands=list(need.commands),
                paths=list(need.paths),
                npu=need.npu,
                clang_omp=need.clang_omp,
            )
        req.update(
            ports=self.ports[h], token=self.token, host=h, write=write, cleanup=cleanup, peers=peers
        )
        return req

    def round(
        self, fan: Fanout, hosts: list[str], write: bool, cleanup: bool, full: bool
    ) -> dict[str, HostOutcome[dict[str, Any]]]:
        return fan.each(
            lambda h: _probe(self.transports(h), self.request(h, write, cleanup, full)), hosts,
            key=str,
        )  # fmt: skip


def _probe_hosts(probes: _Probes) -> dict[str, dict[str, Any]]:
    """Each host's probe output in the plan's host order (`{"error": ...}` where it failed)."""
    hosts = probes.hosts
    with Fanout(min(16, max(1, len(hosts)))) as fan:
        outcomes = probes.round(fan, hosts, write=True, cleanup=False, full=True)
        results: dict[str, dict[str, Any]] = {
            h: o.value if o.value is not None else {"error": str(o.error)}
            for h, o in ((h, outcomes[h]) for h in hosts)
        }
        if probes.sharing:
            # Second round: who can read whose token. Only when every host has read, a third
            # round removes the tokens (removing them while reading raced with slower peers).
            # A failed later round leaves the first round's view (a token left behind is a
            # small hidden file; not worth failing).
            reached = [h for h in hosts if "error" not in results[h]]
            for h, o in probes.round(fan, reached, write=False, cleanup=False, full=False).items():
                if o.value is not None:
                    results[h]["shared"] = o.value["shared"]
            probes.round(fan, reached, write=False, cleanup=True, full=False)
    return results


def _reached_checks(
    plan: Plan, transports: Callable[[str], Transport], versions: Versions, checks: list[Check]
) -> list[Check]:
    """The checks that ask the hosts the first probe reached: services, the sparse planner,
    pinned versions, the channel and the owner of the run directories."""
    from kvpd.exec.preflight.versions import service_versions  # imports Check from here

    reached_hosts = {c.host for c in checks if c.name == "reachable" and c.ok}
    more = service_versions(plan, transports, reached_hosts)
    more += planner_checks(plan, transports, reached_hosts)
    more += pinned_checks(plan, versions, transports, reached_hosts)
    with Fanout(min(16, max(1, len(reached_hosts)))) as fan:
        more += channel_checks(sorted(reached_hosts), transports, fan)
        more += owner_checks(plan, transports, sorted(reached_hosts), fan)
    return more


def busy_detail(t: Transport, busy: list[int]) -> str:
    """ "in use: [ports]", naming the kvpd process (deployment, who started it) that holds a
    port when its host's records say so (exec/records/conflicts.py)."""
    detail = f"in use: {busy}"
    try:
        holders = port_holders(t, list(busy)) if busy else {}
    except Exception:  # noqa: BLE001 - the names are a courtesy; the check stands without them
        holders = {}
    named = [f"{port} by {who}" for port, who in sorted(holders.items())]
    return detail + (f" ({'; '.join(named)})" if named else "")
