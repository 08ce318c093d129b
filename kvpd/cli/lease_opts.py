"""`--break-lease` of `up`, `down` and `restart`: take over the lease of a deployment another
change holds (kvpd.exec.lease.scope), after the user confirms whose lease it is."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import typer

from kvpd.errors import TransportError

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from kvpd.exec.lease.host import Held
    from kvpd.exec.lease.model import Operation
    from kvpd.exec.service import Deployments
    from kvpd.plan.value import Plan

BREAK_HELP = (
    "Take over the deployment's lease from the change holding it (asks first; --yes does "
    "not): for a kvpd that hangs or whose machine is gone. The holder's change may still run."
)
# The options of `down` and `restart` (`up` has its own --yes, which also skips its prompt);
# typer reads an option's definition without changing it, so one serves every command.
BREAK_LEASE = typer.Option(False, "--break-lease", help=BREAK_HELP)
YES = typer.Option(False, "--yes", "-y", help="Break the lease without asking.")


def _ask(question: str, yes: bool) -> None:
    from kvpd.cli import output

    if yes:
        return
    if not sys.stdin.isatty():
        output.err.print("kvpd: not a terminal; pass --yes with --break-lease to take it over.")
        raise typer.Exit(2)
    typer.confirm(question, abort=True)


def break_target(svc: Deployments, plan: Plan, *, break_lease: bool, yes: bool) -> str:
    """What the user confirmed taking over ('' without --break-lease, or when the lease is
    free or expired): the holder's lease as shown, or going on without one when its host cannot
    be asked."""
    from kvpd.exec.lease import model as lease
    from kvpd.exec.lease.host import UNLEASED

    if not break_lease:
        return ""
    try:
        seen, decision = svc.peek_lease(plan)
    except TransportError as e:
        _ask(f"{e}.\nGo on without a lease?", yes)
        return UNLEASED
    if decision.may_take:
        return ""
    left = f"its lease expires in {decision.remaining_s} s unless renewed"
    _ask(
        f"Deployment {plan.deployment!r} is being changed by {lease.holder_line(decision.record)}"
        f" ({left}). Take the lease over? That change may still be running.",
        yes,
    )
    return seen.target


def hold(
    svc: Deployments, plan: Plan, operation: Operation, *, break_lease: bool, yes: bool
) -> AbstractContextManager[Held | None]:
    """The lease of `plan` for `operation`, held for a CLI verb's whole run (its prompts,
    canary and purge included)."""
    target = break_target(svc, plan, break_lease=break_lease, yes=yes)
    return svc.lease(plan, operation, take_over=target)
