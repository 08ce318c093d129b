"""`kvpd up`, `down`, `status` and `logs`: start, stop and inspect a deployment."""

from __future__ import annotations

import signal
import sys
import time
from typing import TYPE_CHECKING

import typer

from kvpd.errors import KvpdError, StateError

if TYPE_CHECKING:
    from kvpd.exec.state import StateStore
    from kvpd.exec.transport import Transport
    from kvpd.plan.model import Plan


def _load_plan(
    profile: str,
    *,
    rehearse: bool = False,
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
        from kvpd.exec.executor import Executor
        from kvpd.exec.state import StateStore
        from kvpd.exec.transports import TransportPool

        plan = _load_plan(profile, rehearse=rehearse, inventory=inventory, sets=sets)
        store = StateStore()
        pool = TransportPool(plan.hosts, accept_unknown_host_key=accept_new_host_keys)
        try:  # before asking: a running deployment is refused whatever the answer
            Executor(pool, store=store).refuse_if_running(plan.deployment, profile)
        except BaseException:
            pool.close()
            raise
        if not skip_preflight:
            from kvpd.exec.preflight import run_preflight

            if not run_preflight(plan, as_json=json_out, pool=pool, quiet_if_ok=True):
                pool.close()
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
                pool.close()
                output.err.print("kvpd: not a terminal; pass --yes to start without asking.")
                raise typer.Exit(2)
            try:
                typer.confirm(f"Start deployment {plan.deployment!r}?", abort=True)
            finally:
                pool.close()  # reopened on demand by the executor
        names = [(p.name, p.host) for p in plan.processes]
        # node bundle: its own step of the progress, one row per host, before the processes
        names = [(f"bundle@{h}", h) for h in dict.fromkeys(u.host for u in plan.bundle)] + names
        state = None
        # SIGTERM (e.g. a CI timeout) takes the same path as Ctrl-C: roll back, then exit.
        old_term = signal.signal(signal.SIGTERM, _interrupt)
        try:
            if json_out:
                ex = Executor(pool, store=store, grace_s=grace, serial=serial)
                state = ex.up(plan, profile=profile)
            else:
                with output.LiveProgress(names, f"up {plan.deployment}") as progress:
                    ex = Executor(pool, progress, store=store, grace_s=grace, serial=serial)
                    state = ex.up(plan, profile=profile)
        except KvpdError as e:
            if json_out:
                failed = store.load(plan.deployment)
                data = output.state_json(failed, str(store.path(plan.deployment))) if failed else {}
                output.print_json({**data, "status": "failed", "error": str(e)})
            raise
        finally:
            signal.signal(signal.SIGTERM, old_term)
            pool.close()
        if json_out:
            data = output.state_json(state, str(store.path(plan.deployment)))
            output.print_json({**data, "bundle": state.bundle})
            return
        output.out.print(output.up_table(state))
        for b in state.bundle:  # node bundle: hosts left without the native core
            if b.get("implementation") != "native" and b.get("slot") == "engine":
                output.err.print(
                    f"[yellow]warning:[/] {b['host']}: kvpd's native core is not available "
                    f"for {b.get('platform')} ({b.get('native', {}).get('reason')}); engines "
                    "there use the NumPy fallback."
                )
        if plan.proxy_url:
            output.out.print(f"Proxy: {plan.proxy_url}")
        output.out.print(f"Stop with: kvpd down {profile}")

    @app.command("down")
    def down_cmd(
        profile: str | None = typer.Argument(None, help="Profile or deployment name."),
        deployment: str | None = typer.Option(None, "--deployment", help="Deployment name."),
        grace: float = typer.Option(20.0, "--grace", help="Seconds between SIGTERM and SIGKILL."),
        json_out: bool = typer.Option(False, "--json", help="Print the result as JSON."),
        purge: bool = typer.Option(
            False,
            "--purge",
            help="Also remove each host's run dir (logs, files, the kvpd node bundle).",
        ),
    ) -> None:
        """Stop a deployment (reverse order, SIGTERM then SIGKILL); verify nothing is left.
        The run dirs stay (the next `up` reuses the installed node bundle) unless --purge."""
        from kvpd.cli import output
        from kvpd.exec.executor import Executor
        from kvpd.exec.state import StateStore
        from kvpd.exec.transports import TransportPool

        store = StateStore()
        name = _resolve_deployment(profile, deployment, store)
        state = store.load(name)
        if state is None:
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
        pool = TransportPool(state.plan.hosts)
        try:
            if json_out:
                result = Executor(pool, store=store, grace_s=grace).down(state)
            else:
                names = [(r.name, r.host) for r in state.processes]
                with output.LiveProgress(names, f"down {name}") as progress:
                    result = Executor(pool, progress, store=store, grace_s=grace).down(state)
            purged = None
            if purge and not result.stop.leftover:  # only once nothing runs from them
                from kvpd.exec.purge import purge_run_dirs

                purged = purge_run_dirs(state, lambda h: pool[h])
        finally:
            pool.close()
        if json_out:
            data = output.down_json(result)
            if purged is not None:
                data["purged"] = {h: purged.get(h, "removed") for h in state.run_dirs}
            output.print_json(data)
        elif result.nothing_running and result.clean:
            output.out.print(f"Nothing is running for deployment {name!r}.")
        else:
            output.out.print(output.down_table(result))
        problems = []
        if purged is not None and not json_out:
            for h, d in sorted(state.run_dirs.items()):
                output.out.print(f"{h}: {purged.get(h) or f'removed {d}'}")
        if purged:
            problems.append(
                "purge incomplete: " + "; ".join(f"{h}: {p}" for h, p in purged.items())
            )
        if result.stop.leftover:
            problems.append("still running: " + ", ".join(o.name for o in result.stop.leftover))
        for host, ports in result.stop.busy_ports.items():
            problems.append(
                f"ports {', '.join(map(str, ports))} still listening on {host} "
                "(another process holds them: `ss -ltnp` shows which)"
            )
        if problems:
            raise StateError(f"down of {name!r} incomplete: " + "; ".join(problems))

    @app.command("status")
    def status_cmd(
        profile: str | None = typer.Argument(None, help="Profile or deployment name."),
        deployment: str | None = typer.Option(None, "--deployment", help="Deployment name."),
        json_out: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    ) -> None:
        """Show each process: alive, healthy (one probe), uptime, ports."""
        from kvpd.cli import output
        from kvpd.exec.executor import Executor, load_state
        from kvpd.exec.state import StateStore
        from kvpd.exec.transports import TransportPool

        store = StateStore()
        name = _resolve_deployment(profile, deployment, store)
        state = load_state(name, store)
        pool = TransportPool(state.plan.hosts)
        try:
            rows = Executor(pool, store=store).status(state)
        finally:
            pool.close()
        if json_out:
            data = output.status_json(name, rows)
            output.print_json({**data, "status": state.status, "bundle": state.bundle})
            return
        output.out.print(output.status_table(f"{name} ({state.status})", rows))
        if state.bundle:  # node bundle: what `up` verified on each host
            from kvpd.cli.bundle_view import status_table

            output.out.print(status_table(state.bundle))

    @app.command("logs")
    def logs_cmd(
        name: str = typer.Argument(..., help="Process name, e.g. decode-0 or proxy."),
        follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new lines."),
        lines: int = typer.Option(50, "-n", "--lines", help="How many last lines to show."),
        deployment: str | None = typer.Option(None, "--deployment", help="Deployment name."),
    ) -> None:
        """Print the log of one process (from its host)."""
        from kvpd.exec.state import StateStore
        from kvpd.exec.transports import open_transport

        store = StateStore()
        dep = deployment or _deployment_with_process(name, store)
        state = store.load(dep)
        if state is None:
            raise StateError(f"no state for deployment {dep!r} under {store.root}.")
        rec = state.record(name)
        if rec is None:
            known = ", ".join(r.name for r in state.processes) or "none started"
            raise StateError(f"deployment {dep!r} has no process {name!r} (known: {known}).")
        t = open_transport(state.plan.host(rec.host))
        try:
            r = t.run(["tail", "-n", str(lines), rec.log], timeout_s=30)
            if not r.ok:
                raise StateError(f"cannot read {rec.log} on {rec.host}: {r.stderr.strip()}")
            sys.stdout.write(r.stdout)
            sys.stdout.flush()
            if follow:
                _follow(t, rec.log)
        finally:
            t.close()


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _deployment_with_process(name: str, store: StateStore) -> str:
    known = store.deployments()
    having = [d for d in known if (s := store.load(d)) is not None and s.record(name)]
    if len(having) == 1:
        return having[0]
    if not having:
        raise StateError(f"no deployment under {store.root} has a process {name!r}.")
    raise StateError(f"{name!r} exists in {', '.join(having)}: pick one with --deployment.")


def _follow(t: Transport, log: str) -> None:
    """Poll the file size and print what was appended, until Ctrl-C."""

    def size() -> int:
        r = t.run(["stat", "-c", "%s", log], timeout_s=30)
        return int(r.stdout.strip()) if r.ok and r.stdout.strip().isdigit() else 0

    offset = size()
    try:
        while True:
            time.sleep(0.5)
            now = size()
            if now < offset:  # truncated or replaced: start over
                offset = 0
            if now > offset:  # exactly the bytes [offset, now): the file may grow meanwhile
                r = t.run(
                    [
                        "dd",
                        f"if={log}",
                        "iflag=skip_bytes,count_bytes",
                        f"skip={offset}",
                        f"count={now - offset}",
                        "bs=65536",
                        "status=none",
                    ],
                    timeout_s=30,
                )
                if r.ok:
                    sys.stdout.write(r.stdout)
                    sys.stdout.flush()
                offset = now
    except KeyboardInterrupt:
        return
