"""`kvpd restart` (rolling) and `kvpd diagnose`: acting on a running (or broken) deployment."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from kvpd.cli import complete, lease_opts, target
from kvpd.errors import StateError

if TYPE_CHECKING:
    from kvpd.exec.rolling import Step


def split_targets(targets: list[str], known: list[str]) -> tuple[str, list[str]]:
    """`[DEPLOYMENT] [NAME ...]`: the first word is the deployment when one has that name;
    else the deployment is the only one there is."""
    if targets and targets[0] in known:
        return targets[0], targets[1:]
    if len(known) == 1:
        return known[0], targets
    if not known:
        raise StateError("no deployments here: nothing was started from this directory.")
    raise StateError(
        f"{len(known)} deployments ({', '.join(known)}): name one first, "
        "e.g. `kvpd restart DEPLOYMENT decode-0`."
    )


def show_step(step: Step) -> None:
    """One line per restarted process as it finishes, its canary and notes below."""
    from kvpd.cli import output

    drained = {None: "", True: ", drained", False: ", drain timed out"}[step.drained]
    output.out.print(f"restarted {step.name} in {step.seconds:.1f}s{drained}")
    if step.canary:
        output.out.print(f"  {step.canary}")
    for note in step.notes:
        output.err.print(f"  [yellow]note:[/] {note}")


def restart_cmd(
    targets: list[str] = typer.Argument(
        None,
        help="[DEPLOYMENT] [NAME|GROUP ...]: processes (decode-0) or groups (decode, "
        "prefill, proxy) to restart one at a time; all when none is named.",
        autocompletion=complete.processes,
    ),
    grace: float = typer.Option(20.0, "--grace", help="Seconds between SIGTERM and SIGKILL."),
    drain_timeout: float = typer.Option(
        60.0, "--drain-timeout", help="Longest wait for a backend's in-flight requests."
    ),
    no_canary: bool = typer.Option(False, "--no-canary", help="Skip the canary per process."),
    inventory: str | None = target.INVENTORY,
    sets: list[str] = target.SETS,
    rehearse: bool = target.REHEARSE,
    rehearse_with: str | None = target.REHEARSE_WITH,
    break_lease: bool = lease_opts.BREAK_LEASE,
    yes: bool = lease_opts.YES,
) -> None:
    """Rolling restart: drain, stop, start, health gate, re-admit, canary; one at a time.
    `kvpd restart PROFILE NAME` (with --inventory as `up` had it) works from any
    controller: what the hosts record is restarted, with the launch the profile plans."""
    from kvpd.bench import canary
    from kvpd.cli import output
    from kvpd.exec.service import Deployments

    with Deployments(grace_s=grace) as svc:
        words = list(targets or [])
        how = rehearse_with or rehearse
        if words and (inventory or sets or how or Path(words[0]).is_file()):  # PROFILE first
            name, plan = target.resolve(words[0], None, svc.store, inventory=inventory,
                                        sets=sets, rehearse=how)  # fmt: skip
            names = words[1:]
        else:
            name, names = split_targets(words, svc.store.deployments())
            plan = target.from_cache(svc.store, name)

        hold = lease_opts.hold(svc, plan, "restart", break_lease=break_lease, yes=yes)
        # the service keeps answering during a restart: the check shares batches with it
        live = functools.partial(canary.run, live_traffic=True)
        check = None if no_canary or not canary.applies(plan) else live
        with hold:
            steps = svc.roll(name, names, canary=check, drain_timeout_s=drain_timeout,
                             on_step=show_step, plan=plan)  # fmt: skip
    output.out.print(f"{name}: {len(steps)} processes restarted, one at a time.")


def diagnose_cmd(
    deployment: str | None = typer.Argument(
        None,
        help="Deployment (optional when there is one).",
        autocompletion=complete.deployments,
    ),  # fmt: skip
    lines: int = typer.Option(200, "-n", "--lines", help="Log lines per process."),
    shareable: bool = typer.Option(
        False,
        "--shareable",
        help="An archive to hand to others: masked log tails, summary and machine facts "
        "only; no state, environments, rendered files, addresses, run dirs or key paths.",
    ),
    inventory: str | None = target.INVENTORY,
    sets: list[str] = target.SETS,
    rehearse: bool = target.REHEARSE,
    rehearse_with: str | None = target.REHEARSE_WITH,
) -> None:
    """Gather logs, files, state and host facts from every host; a likely cause per process."""
    from kvpd.cli import output
    from kvpd.exec.service import Deployments

    with Deployments() as svc:
        name, plan = target.resolve(deployment, None, svc.store, inventory=inventory,
                                    sets=sets, rehearse=rehearse_with or rehearse)  # fmt: skip
        report = svc.diagnose(name, lines=lines, shareable=shareable, plan=plan)
    output.out.print(output.diagnose_table(report))
    output.out.print(f"Archive: {report.archive}")


def register(app: typer.Typer) -> None:
    app.command("restart")(restart_cmd)
    app.command("diagnose")(diagnose_cmd)
