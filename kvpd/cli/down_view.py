"""The steps of `kvpd down`, one concern each: the stop (with live progress or quiet for
--json), the purge, the report and the verdict."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvpd.errors import StateError

if TYPE_CHECKING:
    from kvpd.exec.processes.stop import DownResult
    from kvpd.exec.service import Deployments
    from kvpd.exec.state import DeploymentState
    from kvpd.plan.value import Plan


def stop(svc: Deployments, name: str, plan: Plan, *, as_json: bool) -> DownResult | None:
    """Stop what the hosts record of `name`: live progress on a terminal, quiet for --json."""
    from kvpd.cli import output

    if as_json:
        return svc.down(name, plan=plan)
    names = [(p.name, p.host) for p in plan.processes]
    with output.LiveProgress(names, f"down {name}") as progress:
        return svc.down(name, progress, plan=plan)


def purge(
    svc: Deployments, name: str, result: DownResult | None, state: DeploymentState | None
) -> tuple[DownResult | None, dict[str, str] | None]:
    """--purge: remove the run dirs, only once nothing runs from them. Nothing running (an
    earlier `down`) still purges. Returns the down's result and host -> why a run dir was
    kept (None when nothing was purged)."""
    from kvpd.exec.processes.stop import DownResult

    if state is None:
        return result, None
    if result is None:
        result = DownResult(name)
    if result.stop.leftover:
        return result, None
    return result, svc.purge(state)


def nothing_to_stop(name: str, *, as_json: bool) -> None:
    """No host records a process of `name`."""
    from kvpd.cli import output

    if as_json:
        output.print_json(
            {
                "deployment": name,
                "nothing_running": True,
                "clean": True,
                "processes": [],
                "busy_ports": {},
            }
        )
    else:
        output.out.print(f"Nothing to stop: no host records a process of {name!r}.")


def report(
    name: str,
    result: DownResult,
    state: DeploymentState,
    purged: dict[str, str] | None,
    *,
    as_json: bool,
) -> None:
    """What was stopped (and, with --purge, which run dirs were removed)."""
    from kvpd.cli import output

    if as_json:
        data = output.down_json(result)
        if purged is not None:
            data["purged"] = {h: purged.get(h, "removed") for h in state.run_dirs}
        output.print_json(data)
        return
    if result.nothing_running and result.clean:
        output.out.print(f"Nothing is running for deployment {name!r}.")
    else:
        output.out.print(output.down_table(result))
    if purged is not None:
        for h, d in sorted(state.run_dirs.items()):
            output.out.print(f"{h}: {purged.get(h) or f'removed {d}'}")


def verdict(name: str, result: DownResult, purged: dict[str, str] | None) -> None:
    """Raise when something is left: a process, a busy port, a refused record, a run dir."""
    from kvpd.exec.service import problems

    left = problems(result)
    if purged:
        left.append("purge incomplete: " + "; ".join(f"{h}: {p}" for h, p in purged.items()))
    if left:
        raise StateError(f"down of {name!r} incomplete: " + "; ".join(left))
