"""What `kvpd status` adds from the host records: who started the deployment, drift from the
profile given, and records refused or hosts not asked."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvpd.exec.records.current import Current
    from kvpd.exec.state import DeploymentState
    from kvpd.plan.value import Plan


def records_json(state: DeploymentState, seen: Current | None) -> dict[str, Any]:
    if seen is None:
        return {}
    return {
        "started_by": state.started_by,
        "started_at": state.created_at,
        "plan_digest": state.profile_digest,
        "drift": {
            "running_plan_digests": seen.drift.running_digests,
            "processes": seen.drift.processes,
        },
        "refused_records": seen.refused,
        "unreachable": seen.unreachable,
        # Sessions with the deployment's marks that no record names (not in "processes").
        "unrecorded": [
            {"host": r.host, "pgid": r.pgid, "name": r.name.removesuffix(" (unrecorded)")}
            for r in seen.unrecorded
        ],
    }


def records_lines(plan: Plan, state: DeploymentState, seen: Current | None) -> list[str]:
    """Lines after the status table (empty when all is as the profile plans)."""
    if seen is None:
        return []
    out = []
    if state.started_by and state.processes:
        import time

        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(state.created_at))
        out.append(f"started by {state.started_by} at {when} (plan {state.profile_digest})")
    if not state.processes and not seen.refused and not seen.unreachable:
        out.append(
            f"{plan.deployment}: stopped (no host records a process of it)"
            if not seen.unrecorded
            else f"{plan.deployment}: no host records a process of it, but some still run"
        )
    out += [
        f"{r.host}: process group {r.pgid} ({r.name.removesuffix(' (unrecorded)')}) runs in "
        "this deployment's run dir with its environment, but no record names it (an `up` "
        "stopped between a start and its record). Fix: `kvpd down` with this profile stops it"
        for r in seen.unrecorded
    ]
    out += seen.unasked
    if seen.drift:
        out.append(seen.drift.line(plan))
    out += [f"refused: {why}" for why in seen.refused.values()]
    out += [
        f"{h}: not asked ({e}); shown from the local cache" for h, e in seen.unreachable.items()
    ]
    return out
