"""`kvpd up`, `down`, `status` and `logs`: start, stop and inspect a deployment."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import typer

from kvpd.cli import bundle_view, complete, down_view, lease_opts, records_out, target, up_view
from kvpd.cli.terminal import clean

if TYPE_CHECKING:
    from kvpd.plan.value import Plan


def _load_plan(
    profile: str,
    *,
    rehearse: bool | str = False,
    inventory: str | None = None,
    sets: list[str] | None = None,
    scenarios: bool = True,
) -> Plan:
    import os

    from kvpd.plan.build import load_plan

    return load_plan(
        profile,
        rehearse=rehearse,
        inventory=inventory,
        sets=sets,
        base_dir=os.getcwd(),
        scenarios=scenarios,
    )


def up_cmd(
    profile: str = typer.Argument(..., help="Profile file or bundled profile name."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Start without asking."),
    json_out: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    grace: float = typer.Option(
        20.0, "--grace", help="Seconds between SIGTERM and SIGKILL when rolling back."
    ),
    rehearse: bool = typer.Option(
        False, "--rehearse", help="Run the topology on CPU hosts (see `kvpd plan --rehearse`)."
    ),
    rehearse_with: str | None = typer.Option(
        None,
        "--rehearse-with",
        help="Rehearse with this engine: vllm (CPU vLLM, what --rehearse runs) or standin "
        "(kvpd's stand-in: the topology at full size, no inference).",
    ),
    inventory: str | None = typer.Option(
        None, "--inventory", help="YAML merged over the profile (real host addresses, ssh)."
    ),
    sets: list[str] = typer.Option([], "--set", help="Override a field: path.to.field=value"),
    accept_new_host_keys: bool = typer.Option(
        False, "--accept-new-host-keys", help="Trust SSH host keys not in known_hosts yet."
    ),
    skip_preflight: bool = typer.Option(
        False, "--skip-preflight", help="Do not run the read-only checks on the hosts first."
    ),
    serial: bool = typer.Option(
        False, "--serial", help="Bring each stage up one host at a time (slow; a baseline)."
    ),
    no_canary: bool = typer.Option(
        False, "--no-canary", help="Skip the request that proves P/D works after start."
    ),
    keep_on_failure: bool = typer.Option(
        False, "--keep-on-failure", help="Leave the deployment up when the canary fails."
    ),
    verify_outputs: bool = typer.Option(
        True,
        "--verify-outputs/--no-verify-outputs",
        help="After the canary, compare greedy completions through the proxy with a "
        "prefill (or mixed) engine's own: KV that moved with the wrong content fails `up`.",
    ),
    break_lease: bool = lease_opts.BREAK_LEASE,
) -> None:
    """Start a deployment: write its files, start its stages in order, gate on health."""
    from kvpd.exec.service import Deployments

    how = rehearse_with or rehearse
    plan = _load_plan(profile, rehearse=how, inventory=inventory, sets=sets)
    with (
        Deployments(accept_new_host_keys=accept_new_host_keys, grace_s=grace, serial=serial) as svc,
        up_view.leased(
            svc,
            plan,
            profile,
            preflight=not skip_preflight,
            as_json=json_out,
            break_lease=break_lease,
            yes=yes,
        ),  # fmt: skip
    ):
        prepared = up_view.gate(svc, plan, profile, preflight=not skip_preflight, as_json=json_out)
        if not json_out:
            up_view.show_summary(plan)
        if not yes:
            up_view.ask(plan)
        recipe = target.recipe(profile, inventory, sets, how)
        state = up_view.start(svc, prepared, profile, recipe, as_json=json_out)
        if not json_out:
            up_view.show_layout(svc, plan)
        result = None
        if not no_canary:
            result = up_view.run_canary(
                svc, plan, verify_outputs=verify_outputs, keep_on_failure=keep_on_failure
            )
    if json_out:
        up_view.report_json(svc, plan, state, result)
    else:
        up_view.report_table(state, profile)
    if result is not None and not result.ok:
        up_view.canary_failed(plan, result.problems, profile, keep_on_failure)
    if not json_out:
        up_view.show_next(plan, result, profile)


def down_cmd(
    profile: str | None = typer.Argument(
        None, help="Profile or deployment name.", autocompletion=complete.deployments
    ),
    deployment: str | None = typer.Option(None, "--deployment", help="Deployment name."),
    grace: float = typer.Option(20.0, "--grace", help="Seconds between SIGTERM and SIGKILL."),
    json_out: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    purge: bool = typer.Option(
        False,
        "--purge",
        help="Also remove each host's run dir (logs, files, the kvpd node bundle).",
    ),
    inventory: str | None = target.INVENTORY,
    sets: list[str] = target.SETS,
    rehearse: bool = target.REHEARSE,
    rehearse_with: str | None = target.REHEARSE_WITH,
    break_lease: bool = lease_opts.BREAK_LEASE,
    yes: bool = lease_opts.YES,
) -> None:
    """Stop a deployment (reverse order, SIGTERM then SIGKILL); verify nothing is left.
    The run dirs stay (the next `up` reuses the installed node bundle) unless --purge."""
    from kvpd.exec.service import Deployments

    with Deployments(grace_s=grace) as svc:
        name, plan = target.resolve(profile, deployment, svc.store, inventory=inventory,
                                    sets=sets, rehearse=rehearse_with or rehearse)  # fmt: skip
        with lease_opts.hold(svc, plan, "down", break_lease=break_lease, yes=yes):
            result = down_view.stop(svc, name, plan, as_json=json_out)
            state = svc.seen.state if svc.seen is not None else None
            purged = None
            if purge:
                result, purged = down_view.purge(svc, name, result, state)
    if result is None or state is None:  # both or neither
        down_view.nothing_to_stop(name, as_json=json_out)
        return
    down_view.report(name, result, state, purged, as_json=json_out)
    down_view.verdict(name, result, purged)


def status_cmd(
    profile: str | None = typer.Argument(
        None, help="Profile or deployment name.", autocompletion=complete.deployments
    ),
    deployment: str | None = typer.Option(None, "--deployment", help="Deployment name."),
    json_out: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    events: bool = typer.Option(
        False, "--events", help="Show the deployment's event log (up, down, canary, ...)."
    ),
    inventory: str | None = target.INVENTORY,
    sets: list[str] = target.SETS,
    rehearse: bool = target.REHEARSE,
    rehearse_with: str | None = target.REHEARSE_WITH,
) -> None:
    """Show each process as its host records it: alive, healthy (one probe), uptime, ports;
    and what differs from the profile given (drift)."""
    from kvpd.cli import output
    from kvpd.exec.service import Deployments

    with Deployments() as svc:
        name, plan = target.resolve(profile, deployment, svc.store, inventory=inventory,
                                    sets=sets, rehearse=rehearse_with or rehearse)  # fmt: skip
        if events:
            history = svc.history(name)
            if json_out:
                output.print_json({"deployment": name, "events": [vars(e) for e in history]})
            else:
                output.out.print(output.events_table(name, history))
            return
        state, rows = svc.status(name, plan=plan)
        seen = svc.seen
        # A process its supervisor gave up on: the end of its log says why.
        tails = {
            r.name: svc.logs(r.name, deployment=name, lines=15, plan=plan).text
            for r in rows
            if r.supervisor is not None and r.supervisor.state == "failed"
        }
    if json_out:
        data = output.status_json(name, rows)
        for p in data["processes"]:
            if p["name"] in tails:
                p["log_tail"] = tails[p["name"]].splitlines()
        bundle = [b.to_json() for b in state.bundle]
        output.print_json({**data, **records_out.records_json(state, seen),
                           "status": state.status, "bundle": bundle})  # fmt: skip
        return
    output.out.print(output.status_table(f"{name} ({state.status})", rows))
    for line in records_out.records_lines(plan, state, seen):
        output.err.print(line, markup=False)
    if state.bundle:  # node bundle: what `up` verified on each host
        output.out.print(bundle_view.status_table(state.bundle))
    for proc, text in tails.items():
        output.out.print(f"{proc} stopped restarting; the end of its log:")
        output.out.print(text.rstrip(), markup=False)


def logs_cmd(
    targets: list[str] = typer.Argument(
        ...,
        help="[DEPLOYMENT] PROCESS, e.g. `local decode-0` (deployment optional when only "
        "one has such a process).",
        autocompletion=complete.processes,
    ),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new lines."),
    lines: int = typer.Option(50, "-n", "--lines", help="How many last lines to show."),
    deployment: str | None = typer.Option(None, "--deployment", help="Deployment name."),
    inventory: str | None = target.INVENTORY,
    sets: list[str] = target.SETS,
    rehearse: bool = target.REHEARSE,
    rehearse_with: str | None = target.REHEARSE_WITH,
) -> None:
    """Print the log of one process (from its host). `kvpd logs PROFILE PROCESS` (with
    --inventory as `up` had it) works from any controller."""
    from kvpd.exec.service import Deployments

    if len(targets) > 2 or (len(targets) == 2 and deployment):
        raise typer.BadParameter(
            "give one process: `kvpd logs [DEPLOYMENT] PROCESS`", param_hint="TARGETS"
        )
    if len(targets) == 2:
        deployment, name = targets
    else:
        name = targets[0]
    with Deployments() as svc:
        if deployment is None and len(targets) == 1:  # the only cached one with `name`
            deployment = svc.deployment_with_process(name)
        dep, plan = target.resolve(deployment, None, svc.store, inventory=inventory,
                                   sets=sets, rehearse=rehearse_with or rehearse)  # fmt: skip
        log = svc.logs(name, deployment=dep, lines=lines, plan=plan)
        sys.stdout.write(clean(log.text))  # node output: no escape sequences
        sys.stdout.flush()
        if follow:
            try:
                for chunk in svc.follow(log):
                    sys.stdout.write(clean(chunk))
                    sys.stdout.flush()
            except KeyboardInterrupt:
                return


def register(app: typer.Typer) -> None:
    app.command("up")(up_cmd)
    app.command("down")(down_cmd)
    app.command("status")(status_cmd)
    app.command("logs")(logs_cmd)
