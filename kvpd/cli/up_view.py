"""The steps of `kvpd up`, one concern each: the preflight gate, the summary, the prompt, the
start (with live progress or quiet for --json), the layout check, the canary and the report."""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NoReturn

import typer

from kvpd.cli import bundle_view
from kvpd.errors import DeployError, KvpdError
from kvpd.profile.roles import ENGINE_ROLES

if TYPE_CHECKING:
    from kvpd.exec.preflight.checks import Check
    from kvpd.exec.rolling import CanaryOutcome
    from kvpd.exec.service import Deployments, Prepared
    from kvpd.exec.state import DeploymentState
    from kvpd.plan.value import Plan


@contextmanager
def leased(
    svc: Deployments, plan: Plan, profile: str, *, preflight: bool, as_json: bool,
    break_lease: bool, yes: bool,
) -> Iterator[None]:  # fmt: skip
    """The lease around `up`. When its host cannot be asked, the preflight (read-only) still
    runs so the user sees every host's checks (an unknown host key, an unreachable host), as
    without a lease; then the lease's own error."""
    from kvpd.cli import lease_opts
    from kvpd.exec.lease.host import LeaseHostError

    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(lease_opts.hold(svc, plan, "up", break_lease=break_lease, yes=yes))
        except LeaseHostError:
            if preflight:
                checks = svc.check(plan)
                if not all(c.ok for c in checks):
                    gate_failed(plan, checks, as_json=as_json)
            raise
        yield


def gate_failed(plan: Plan, checks: list[Check], *, as_json: bool) -> NoReturn:
    """Show the failed preflight and stop: nothing was started."""
    from kvpd.cli import output

    output.show_preflight(plan.deployment, checks, as_json=as_json)
    raise KvpdError(
        "preflight failed (table above): nothing was started. Fix the hosts or "
        "the profile, or pass --skip-preflight to start anyway."
    )


def gate(svc: Deployments, plan: Plan, profile: str, *, preflight: bool, as_json: bool) -> Prepared:
    """Prepare `plan` and refuse to go on when a preflight check failed. Runs before the
    prompt: a running deployment is refused whatever the answer. What it returns is what
    `start` hands back to the service, which so knows the checks ran and passed."""

    prepared = svc.prepare(plan, profile=profile, preflight=preflight)
    if not prepared.ok:
        gate_failed(plan, list(prepared.checks), as_json=as_json)
    return prepared


def show_summary(plan: Plan) -> None:
    """What is about to start, and the plan's warnings."""
    from kvpd.cli import output

    output.out.print(output.plan_summary(plan))
    for w in plan.warnings:
        output.err.print(f"[yellow]warning:[/] {w}")


def ask(plan: Plan) -> None:
    """Ask before starting; without a terminal there is no one to ask (exit 2)."""
    from kvpd.cli import output

    if not sys.stdin.isatty():
        output.err.print("kvpd: not a terminal; pass --yes to start without asking.")
        raise typer.Exit(2)
    typer.confirm(f"Start deployment {plan.deployment!r}?", abort=True)


def progress_rows(plan: Plan) -> list[tuple[str, str]]:
    """The progress rows: the node bundle first (its own step, one row per host), then the
    processes in plan order."""
    hosts = dict.fromkeys(u.host for u in plan.bundle)
    return [(f"bundle@{h}", h) for h in hosts] + [(p.name, p.host) for p in plan.processes]


def start(
    svc: Deployments, prepared: Prepared, profile: str, recipe: dict[str, Any], *, as_json: bool
) -> DeploymentState:
    """Start the plan `gate` prepared: live progress on a terminal, quiet for --json (where a
    failure still prints the JSON of what the store recorded before it is raised)."""
    from kvpd.cli import output

    plan = prepared.plan
    try:
        if as_json:
            return svc.up(plan, profile=profile, prepared=prepared, recipe=recipe)
        with output.LiveProgress(progress_rows(plan), f"up {plan.deployment}") as progress:
            return svc.up(
                plan, profile=profile, reporter=progress, prepared=prepared, recipe=recipe
            )
    except KvpdError as e:
        if as_json:
            failed_json(svc, plan, e)
        raise


def failed_json(svc: Deployments, plan: Plan, error: KvpdError) -> None:
    """`up --json` that failed: the store's record of the deployment, status failed."""
    from kvpd.cli import output

    failed = svc.store.load(plan.deployment)
    path = str(svc.store.path(plan.deployment))
    data = output.state_json(failed, path) if failed else {}
    output.print_json({**data, "status": "failed", "error": str(error)})


def show_layout(svc: Deployments, plan: Plan) -> None:
    """The engines' KV layout as their logs confirm it (or warn it is not)."""
    from kvpd.cli import output

    for ok, text in confirm_layout(svc, plan):
        tag = "[green]confirmed:[/]" if ok else "[yellow]warning:[/]"
        output.err.print(f"{tag} {text}")


def confirm_layout(svc: Deployments, plan: Plan) -> list[tuple[bool, str]]:
    """The guide's `Layerwise KV cache reuse merged ...` check, once the engines are healthy
    (vLLM-Ascend logs it when it lays out the KV cache); `kvpd bench` checks it again."""
    from kvpd.bench.logcheck import confirm
    from kvpd.exec.diagnose.causes import current_run

    checks = tuple(c for c in plan.log_checks if c.kind == "layerwise_reuse")
    if not checks:
        return []

    def read(process: str) -> str | None:
        try:
            return current_run(svc.logs(process, deployment=plan.deployment, lines=5000).text)
        except (KvpdError, OSError):
            return None

    got = confirm("as started", checks, read, None)
    return [(False, p) for p in got.problems] + [(True, n) for n in got.notes]


def run_canary(
    svc: Deployments, plan: Plan, *, verify_outputs: bool, keep_on_failure: bool
) -> CanaryOutcome | None:
    """One request through the proxy that proves P/D works; None where no canary applies."""
    from kvpd.bench import canary

    if not canary.applies(plan):
        return None
    check = functools.partial(canary.run, verify_outputs=verify_outputs)
    return svc.canary(plan, check, keep_on_failure=keep_on_failure)


def report_json(
    svc: Deployments, plan: Plan, state: DeploymentState, result: CanaryOutcome | None
) -> None:
    """`up --json`: the started deployment, its node bundle and the canary's outcome."""
    from kvpd.cli import output

    data = output.state_json(state, str(svc.store.path(plan.deployment)))
    data["bundle"] = [b.to_json() for b in state.bundle]
    if result is not None:
        data["canary"] = result.to_dict()
    output.print_json(data)


def report_table(state: DeploymentState, profile: str) -> None:
    """The started processes, and a warning per host left without the native core."""
    from rich.text import Text

    from kvpd.cli import output

    output.out.print(output.up_table(state))
    for b in state.bundle:
        warning = bundle_view.fallback_warning(b, profile)
        if warning:
            output.err.print(Text.assemble(("warning: ", "yellow"), warning))


def canary_failed(plan: Plan, problems: list[str], profile: str, kept: bool) -> None:
    """Raise the canary's failure: what failed, which processes, what was done about it."""
    engines = ", ".join(p.name for p in plan.processes if p.role in ENGINE_ROLES)
    what = "\n".join(f"  - {p}" for p in problems)
    tail = (
        f"The deployment is left up (--keep-on-failure): inspect with `kvpd logs "
        f"{plan.deployment} NAME`, `kvpd diagnose {plan.deployment}`; stop with `kvpd down "
        f"{profile}`."
        if kept
        else "The deployment was stopped; pass --keep-on-failure to keep it up for inspection."
    )
    raise DeployError(
        f"the canary through the proxy failed (processes: proxy, {engines}):\n{what}\n{tail}"
    )


def show_next(plan: Plan, result: CanaryOutcome | None, profile: str) -> None:
    """The canary's line, how to reach the proxy, how to stop."""
    from kvpd.cli import output

    if result is not None:
        output.out.print(result.line)
    if plan.proxy_url:
        from kvpd.cli.forward_cmd import how_to_reach

        host = plan.host(plan.proxy_host) if plan.proxy_host else None
        kind = host.transport if host is not None else "local"
        output.out.print(how_to_reach(plan.proxy_url, plan.proxy_host, kind, plan.deployment))
    output.out.print(f"Stop with: kvpd down {profile}")
