"""`kvpd up`, `down`, `status` and `logs`: start, stop and inspect a deployment."""

from __future__ import annotations

import functools
import sys
from typing import TYPE_CHECKING

import typer

from kvpd.cli import bundle_view, complete, lease_opts, records_out, target
from kvpd.cli.terminal import clean
from kvpd.errors import DeployError, KvpdError, StateError
from kvpd.profile.roles import ENGINE_ROLES

if TYPE_CHECKING:
    from kvpd.exec.service import Deployments
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


def _canary_failed(plan: Plan, problems: list[str], profile: str, kept: bool) -> None:
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


def register(app: typer.Typer) -> None:
    @app.command("up")
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
        break_lease: bool = typer.Option(False, "--break-lease", help=lease_opts.BREAK_HELP),
    ) -> None:
        """Start a deployment: write its files, start its stages in order, gate on health."""
        from rich.text import Text

        from kvpd.bench import canary
        from kvpd.cli import output
        from kvpd.exec.service import Deployments

        plan = _load_plan(
            profile, rehearse=rehearse_with or rehearse, inventory=inventory, sets=sets
        )
        with (
            Deployments(
                accept_new_host_keys=accept_new_host_keys, grace_s=grace, serial=serial
            ) as svc,
            lease_opts.hold(svc, plan, "up", break_lease=break_lease, yes=yes),
        ):
            # Before asking: a running deployment is refused whatever the answer.
            checks = svc.prepare(plan, profile=profile, preflight=not skip_preflight)
            if not all(c.ok for c in checks):
                output.show_preflight(plan.deployment, checks, as_json=json_out)
                raise KvpdError(
                    "preflight failed (table above): nothing was started. Fix the hosts or "
                    "the profile, or pass --skip-preflight to start anyway."
                )
            if not json_out:
                output.out.print(output.plan_summary(plan))
                for w in plan.warnings:
                    output.err.print(f"[yellow]warning:[/] {w}")
            if not yes:
                if not sys.stdin.isatty():
                    output.err.print("kvpd: not a terminal; pass --yes to start without asking.")
                    raise typer.Exit(2)
                typer.confirm(f"Start deployment {plan.deployment!r}?", abort=True)
            names = [(p.name, p.host) for p in plan.processes]
            # node bundle: its own step of the progress, one row per host, before the processes
            names = [(f"bundle@{h}", h) for h in dict.fromkeys(u.host for u in plan.bundle)] + names
            how = target.recipe(profile, inventory, sets, rehearse_with or rehearse)
            try:
                if json_out:
                    state = svc.up(plan, profile=profile, prepared=True, recipe=how)
                else:
                    with output.LiveProgress(names, f"up {plan.deployment}") as progress:
                        state = svc.up(
                            plan, profile=profile, reporter=progress, prepared=True, recipe=how
                        )
            except KvpdError as e:
                if json_out:
                    failed = svc.store.load(plan.deployment)
                    path = str(svc.store.path(plan.deployment))
                    data = output.state_json(failed, path) if failed else {}
                    output.print_json({**data, "status": "failed", "error": str(e)})
                raise
            if not json_out:
                for ok, text in _confirm_layout(svc, plan):
                    tag = "[green]confirmed:[/]" if ok else "[yellow]warning:[/]"
                    output.err.print(f"{tag} {text}")
            result = None
            if not no_canary and canary.applies(plan):
                check = functools.partial(canary.run, verify_outputs=verify_outputs)
                result = svc.canary(plan, check, keep_on_failure=keep_on_failure)
        if json_out:
            data = output.state_json(state, str(svc.store.path(plan.deployment)))
            data["bundle"] = state.bundle
            if result is not None:
                data["canary"] = result.to_dict()
            output.print_json(data)
        else:
            output.out.print(output.up_table(state))
            for b in state.bundle:  # node bundle: hosts left without the native core
                warning = bundle_view.fallback_warning(b, profile)
                if warning:
                    output.err.print(Text.assemble(("warning: ", "yellow"), warning))
        if result is not None and not result.ok:
            _canary_failed(plan, result.problems, profile, keep_on_failure)
        if json_out:
            return
        if result is not None:
            output.out.print(result.line)
        if plan.proxy_url:
            from kvpd.cli.forward_cmd import how_to_reach

            host = plan.host(plan.proxy_host) if plan.proxy_host else None
            kind = host.transport if host is not None else "local"
            output.out.print(how_to_reach(plan.proxy_url, plan.proxy_host, kind, plan.deployment))
        output.out.print(f"Stop with: kvpd down {profile}")

    @app.command("down")
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
        break_lease: bool = typer.Option(False, "--break-lease", help=lease_opts.BREAK_HELP),
        yes: bool = typer.Option(False, "--yes", "-y", help="Break the lease without asking."),
    ) -> None:
        """Stop a deployment (reverse order, SIGTERM then SIGKILL); verify nothing is left.
        The run dirs stay (the next `up` reuses the installed node bundle) unless --purge."""
        from kvpd.cli import output
        from kvpd.exec.service import Deployments, problems
        from kvpd.exec.stop import DownResult

        with Deployments(grace_s=grace) as svc:
            name, plan = target.resolve(profile, deployment, svc.store, inventory=inventory,
                                        sets=sets, rehearse=rehearse_with or rehearse)  # fmt: skip
            with lease_opts.hold(svc, plan, "down", break_lease=break_lease, yes=yes):
                if json_out:
                    result = svc.down(name, plan=plan)
                else:
                    names = [(p.name, p.host) for p in plan.processes]
                    with output.LiveProgress(names, f"down {name}") as progress:
                        result = svc.down(name, progress, plan=plan)
                state = svc.seen.state if svc.seen is not None else None
                if result is None and purge and state is not None:
                    result = DownResult(name)  # nothing runs (an earlier `down`): purge still goes
                purged = None
                if result is not None and state is not None and purge and not result.stop.leftover:
                    purged = svc.purge(state)  # only once nothing runs from the run dirs
        if result is None or state is None:  # both or neither
            if json_out:
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
            return
        if json_out:
            data = output.down_json(result)
            if purged is not None:
                data["purged"] = {h: purged.get(h, "removed") for h in state.run_dirs}
            output.print_json(data)
        elif result.nothing_running and result.clean:
            output.out.print(f"Nothing is running for deployment {name!r}.")
        else:
            output.out.print(output.down_table(result))
        left = problems(result)
        if purged is not None and not json_out:
            for h, d in sorted(state.run_dirs.items()):
                output.out.print(f"{h}: {purged.get(h) or f'removed {d}'}")
        if purged:
            left.append("purge incomplete: " + "; ".join(f"{h}: {p}" for h, p in purged.items()))
        if left:
            raise StateError(f"down of {name!r} incomplete: " + "; ".join(left))

    @app.command("status")
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
            output.print_json({**data, **records_out.records_json(state, seen),
                               "status": state.status, "bundle": state.bundle})  # fmt: skip
            return
        output.out.print(output.status_table(f"{name} ({state.status})", rows))
        for line in records_out.records_lines(plan, state, seen):
            output.err.print(line, markup=False)
        if state.bundle:  # node bundle: what `up` verified on each host
            output.out.print(bundle_view.status_table(state.bundle))
        for proc, text in tails.items():
            output.out.print(f"{proc} stopped restarting; the end of its log:")
            output.out.print(text.rstrip(), markup=False)

    @app.command("logs")
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


def _confirm_layout(svc: Deployments, plan: Plan) -> list[tuple[bool, str]]:
    """The guide's `Layerwise KV cache reuse merged ...` check, once the engines are healthy
    (vLLM-Ascend logs it when it lays out the KV cache); `kvpd bench` checks it again."""
    from kvpd.bench.logcheck import confirm
    from kvpd.errors import KvpdError
    from kvpd.exec.diagnose import current_run

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
