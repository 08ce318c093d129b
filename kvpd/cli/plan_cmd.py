"""`kvpd plan`: validate a profile, derive everything, show or write the plan."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from kvpd.cli import bench_view, bundle_view, container_view, route_view
from kvpd.errors import PlanError
from kvpd.exec.local import private_dirs
from kvpd.plan.value import Plan, ProcessSpec

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

PROFILE_HELP = "profile: a YAML file or a bundled name (local, ucm-centralized-2p2d, ...)"


def write_plan_dir(plan: Plan, out: Path) -> list[Path]:
    """One folder per host with its rendered files, plus plan.json. Atomic per file.

    Every path is checked to resolve inside `out` before anything is written (host names and
    file paths are validated by the schema too; this is the guard that does not trust them).
    """
    root = out.resolve()
    targets: list[tuple[Path, str, int]] = []
    for f in plan.files:
        # absolute host paths land under <host>/ROOT/... so nothing is written outside `out`
        rel = f"ROOT{f.path}" if f.path.startswith("/") else f.path
        path = out / f.host / rel
        resolved = path.resolve()
        if ".." in Path(rel).parts or root not in resolved.parents or not f.host:
            raise PlanError(
                f"refusing to write {f.host}:{f.path} outside {out}. Rename the host or file "
                "so that it is a plain name."
            )
        targets.append((path, f.content, f.mode))
    written = []
    for path, content, mode in [*targets, (out / "plan.json", plan.to_json() + "\n", 0o644)]:
        _write_new(path, content, mode)
        written.append(path)
    return written


def _write_new(path: Path, content: str, mode: int) -> None:
    """Write through a temporary file of a random name created new (O_EXCL: never a planted
    file or symlink) and owner-only while it is written (launch scripts hold secrets), then
    give it `mode` and rename it over `path` (a symlink there is replaced, not followed).
    Directories kvpd creates are 0700."""
    private_dirs(path.parent)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(content)
            os.fchmod(f.fileno(), mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _hosts_table(plan: Plan) -> Table:
    """One row per process, grouped by host (a host without processes gets a row of its own)."""
    from rich.markup import escape
    from rich.table import Table

    title = f"kvpd plan: {escape(plan.deployment)}" + (
        " (rehearsal on CPU hosts)" if plan.rehearsal else ""
    )
    hosts = Table(title=title, show_lines=False)
    for col in ("host", "address", "hw", "process", "role", "stage", "devices", "ports"):
        hosts.add_column(col)
    by_host: dict[str, list[ProcessSpec]] = {}
    for p in plan.processes:
        by_host.setdefault(p.host, []).append(p)
    for h in plan.hosts:
        procs = by_host.get(h.name, [])
        if not procs:
            hosts.add_row(escape(h.name), escape(h.address), h.hardware, "-", "", "", "", "")
        for i, p in enumerate(procs):
            first = i == 0
            hosts.add_row(
                escape(h.name) if first else "",
                escape(h.address) if first else "",
                h.hardware if first else "",
                escape(p.name + (" *" if p.substituted else "")),
                p.role,
                str(p.stage),
                _ranges(p.devices),
                ", ".join(str(x) for x in _ports_short(p.ports)),
            )
    return hosts


def _show_layout(con: Console, plan: Plan) -> None:
    """Start order, files per host, routes, the node bundle and containers."""
    from rich.markup import escape

    order = " -> ".join(
        "{" + ", ".join(escape(p.name) for p in stage) + "}" for stage in plan.stages
    )
    con.print(f"[bold]start order[/bold] (each stage healthy before the next): {order}")
    files: dict[str, list[str]] = {}
    for f in plan.files:
        files.setdefault(f.host, []).append(f.path)
    for host, paths in files.items():
        con.print(route_view.files_line(plan, host, paths), highlight=False)
    for line in route_view.route_lines(plan):
        con.print(line, highlight=False)
    for line in bundle_view.plan_lines(plan):
        con.print(line, highlight=False)
    for line in container_view.plan_lines(plan):  # containers on the nodes
        con.print(escape(line) if line.startswith(" ") else line, highlight=False)


def _show_derived(con: Console, plan: Plan) -> None:
    """Substitutions, the endpoint, sizing and derived values, the bench, the warnings."""
    from rich.markup import escape

    from kvpd.cli.sizing_view import sparse_sizing_lines

    subs = [p for p in plan.processes if p.substituted]
    if subs:
        con.print("[bold]rehearsal substitutions[/bold] (* above):")
        for p in subs:
            con.print(f"  {escape(p.name)}: substituted: {escape(p.substituted)}")
    if plan.proxy_url:
        con.print(
            f"[bold]endpoint[/bold]: {escape(plan.proxy_url)}  (model {escape(plan.served_model)})"
        )
    sparse = plan.sizing.sparse
    for line in sparse_sizing_lines(sparse) if sparse is not None else []:
        con.print(line, highlight=False)
    if plan.derived:
        con.print("[bold]derived[/bold] (formula and inputs):")
        for line in plan.derived:
            con.print(f"  {escape(line)}", highlight=False)
    for line in bench_view.plan_lines(plan):
        con.print(escape(line), highlight=False)
    for w in plan.warnings:
        con.print(f"[yellow]warning[/yellow]: {escape(w)}")


def show_plan(plan: Plan) -> None:
    from rich.console import Console

    con = Console(width=None if Console().is_terminal else 150)
    con.print(_hosts_table(plan))
    _show_layout(con, plan)
    _show_derived(con, plan)
    con.print(f"plan digest {plan.profile_digest}; `kvpd plan ... --out DIR` writes every file.")


def _ranges(devs: tuple[int, ...]) -> str:
    if not devs:
        return ""
    if list(devs) == list(range(devs[0], devs[-1] + 1)) and len(devs) > 2:
        return f"{devs[0]}-{devs[-1]}"
    return ",".join(str(d) for d in devs)


def _ports_short(ports: tuple[int, ...]) -> list[str]:
    """Ports in the plan's order with consecutive runs joined (`20001-20008`); ports that are
    not consecutive stay apart, so unrelated ports never read as one range."""
    runs: list[list[int]] = []
    for port in ports:
        if runs and port == runs[-1][-1] + 1:
            runs[-1].append(port)
        else:
            runs.append([port])
    return [str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs]


def plan_cmd(
    profile: str = typer.Argument(..., help=PROFILE_HELP),
    out: Path | None = typer.Option(None, "--out", help="write files per host + plan.json"),
    as_json: bool = typer.Option(False, "--json", help="print the plan as JSON"),
    check: bool = typer.Option(False, "--check", help="also run preflight checks on hosts"),
    rehearse: bool = typer.Option(False, "--rehearse", help="plan the CPU rehearsal"),
    rehearse_with: str | None = typer.Option(
        None,
        "--rehearse-with",
        help="plan the rehearsal with this engine: vllm (CPU vLLM, what --rehearse runs) "
        "or standin (kvpd's stand-in: the topology at full size, no inference)",
    ),
    inventory: str | None = typer.Option(
        None, "--inventory", help="YAML merged over the profile (real host addresses, ssh)"
    ),
    accept_new_host_keys: bool = typer.Option(False, "--accept-new-host-keys"),
    sets: list[str] = typer.Option([], "--set", help="override a field: path.to.field=value"),
    strict: bool = typer.Option(
        False, "--strict", help="exit 1 when the plan has warnings (for CI)"
    ),
) -> None:
    """Validate PROFILE, derive every value, render every file, and show the plan."""
    from kvpd.plan.build import load_plan

    plan = load_plan(
        profile,
        rehearse=rehearse_with or rehearse,
        base_dir=os.getcwd(),
        sets=sets,
        inventory=inventory,
    )
    if as_json:
        print(plan.to_json())
    else:
        show_plan(plan)
    if out is not None:
        try:
            paths = write_plan_dir(plan, out)
        except OSError as e:
            raise PlanError(
                f"--out {out}: cannot write the plan there ({e.strerror or e}). Pass a "
                "directory you can write to."
            ) from None
        if not as_json:
            print(f"wrote {len(paths)} files under {out}")
    if strict and plan.warnings:
        typer.echo(
            f"--strict: the plan has {len(plan.warnings)} warning(s) (shown above); fix "
            "them or drop --strict.",
            err=True,
        )
        raise typer.Exit(1)
    if check:
        from kvpd.cli.output import show_preflight
        from kvpd.exec.service import Deployments

        with Deployments(accept_new_host_keys=accept_new_host_keys) as svc:
            checks = svc.check(plan)
        if not show_preflight(plan.deployment, checks, as_json=as_json):
            raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("plan")(plan_cmd)
