"""`kvpd up`, `down`, `status` and `logs`: start, stop and inspect a deployment."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import typer

from kvpd.errors import KvpdError, StateError

if TYPE_CHECKING:
    from kvpd.exec.state import StateStore
    from kvpd.plan.model import Plan


def _load_plan(
    profile: str,
    *,
    rehearse: bool | str = False,
    inventory: str | None = None,
    sets: list[str] | None = None,
) -> Plan:
    import os

    from kvpd.plan.build import load_plan

    return load_plan(
        profile, rehearse=rehearse, inventory=inventory, sets=sets, base_dir=os.getcwd()
    )


def _resolve_deployment(profile: str | None, deployment: str | None, store: StateStore) -> str:
    """--deployment wins; else PROFILE (a deployment name, or a profile whose plan names one);
    else the only deployment with state."""
    if deployment:
        return deployment
    known = store.deployments()
    if profile:
        if profile in known:
            return profile
        return _load_plan(profile).deployment
    if len(known) == 1:
        return known[0]
    if not known:
        raise StateError(f"no deployments under {store.root}: nothing was started from here.")
    raise StateError(
        f"{len(known)} deployments under {store.root} ({', '.join(known)}): name one with "
        "PROFILE or --deployment NAME."
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
    ) -> None:
        """Start a deployment: write its files, start its stages in order, gate on health."""
        from kvpd.cli import output
        from kvpd.exec.service import Deployments

        plan = _load_plan(
            profile, rehearse=rehearse_with or rehearse, inventory=inventory, sets=sets
        )
        with Deployments(
            accept_new_host_keys=accept_new_host_keys, grace_s=grace, serial=serial
        ) as svc:
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
            try:
                if json_out:
                    state = svc.up(plan, profile=profile, prepared=True)
                else:
                    with output.LiveProgress(names, f"up {plan.deployment}") as progress:
                        state = svc.up(plan, profile=profile, reporter=progress, prepared=True)
            except KvpdError as e:
                if json_out:
                    failed = svc.store.load(plan.deployment)
                    path = str(svc.store.path(plan.deployment))
                    data = output.state_json(failed, path) if failed else {}
                    output.print_json({**data, "status": "failed", "error": str(e)})
                raise
        if json_out:
            output.print_json(output.state_json(state, str(svc.store.path(plan.deployment))))
            return
        output.out.print(output.up_table(state))
        if plan.proxy_url:
            output.out.print(f"Proxy: {plan.proxy_url}")
        output.out.print(f"Stop with: kvpd down {profile}")

    @app.command("down")
    def down_cmd(
        profile: str | None = typer.Argument(None, help="Profile or deployment name."),
        deployment: str | None = typer.Option(None, "--deployment", help="Deployment name."),
        grace: float = typer.Option(20.0, "--grace", help="Seconds between SIGTERM and SIGKILL."),
        json_out: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    ) -> None:
        """Stop a deployment (reverse order, SIGTERM then SIGKILL); verify nothing is left."""
        from kvpd.cli import output
        from kvpd.exec.service import Deployments, problems

        with Deployments(grace_s=grace) as svc:
            name = _resolve_deployment(profile, deployment, svc.store)
            state = svc.store.load(name)
            if state is None:
                result = None
            elif json_out:
                result = svc.down(name)
            else:
                names = [(r.name, r.host) for r in state.processes]
                with output.LiveProgress(names, f"down {name}") as progress:
                    result = svc.down(name, progress)
        if result is None:
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
                output.out.print(f"Nothing to stop: no state for deployment {name!r}.")
            return
        if json_out:
            output.print_json(output.down_json(result))
        elif result.nothing_running and result.clean:
            output.out.print(f"Nothing is running for deployment {name!r}.")
        else:
            output.out.print(output.down_table(result))
        left = problems(result)
        if left:
            raise StateError(f"down of {name!r} incomplete: " + "; ".join(left))

    @app.command("status")
    def status_cmd(
        profile: str | None = typer.Argument(None, help="Profile or deployment name."),
        deployment: str | None = typer.Option(None, "--deployment", help="Deployment name."),
        json_out: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    ) -> None:
        """Show each process: alive, healthy (one probe), uptime, ports."""
        from kvpd.cli import output
        from kvpd.exec.service import Deployments

        with Deployments() as svc:
            name = _resolve_deployment(profile, deployment, svc.store)
            state, rows = svc.status(name)
        if json_out:
            output.print_json({**output.status_json(name, rows), "status": state.status})
            return
        output.out.print(output.status_table(f"{name} ({state.status})", rows))

    @app.command("logs")
    def logs_cmd(
        name: str = typer.Argument(..., help="Process name, e.g. decode-0 or proxy."),
        follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new lines."),
        lines: int = typer.Option(50, "-n", "--lines", help="How many last lines to show."),
        deployment: str | None = typer.Option(None, "--deployment", help="Deployment name."),
    ) -> None:
        """Print the log of one process (from its host)."""
        from kvpd.exec.service import Deployments

        with Deployments() as svc:
            log = svc.logs(name, deployment=deployment, lines=lines)
            sys.stdout.write(log.text)
            sys.stdout.flush()
            if follow:
                try:
                    for chunk in svc.follow(log):
                        sys.stdout.write(chunk)
                        sys.stdout.flush()
                except KeyboardInterrupt:
                    return
