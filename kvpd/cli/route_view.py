"""Lines of `kvpd plan` about reaching the hosts: each host's SSH route and its run dir."""

from __future__ import annotations

from rich.markup import escape

from kvpd.errors import KvpdError
from kvpd.plan.value import Plan


def route_lines(plan: Plan) -> list[str]:
    """How `up` will connect to each host: direct or through which jump hosts, resolved over
    ~/.ssh/config as the transport resolves it, so a forgotten bastion shows before `up`."""
    ssh = [h for h in plan.hosts if h.transport == "ssh"]
    if not ssh:
        return []
    from kvpd.exec.ssh.config import load_ssh_config, route

    try:
        config = load_ssh_config()
    except KvpdError as e:
        return [f"[bold]ssh routes[/bold]: ~/.ssh/config not read: {escape(str(e))}"]
    out = ["[bold]ssh routes[/bold] (profile over ~/.ssh/config):"]
    for h in ssh:
        try:
            r = route(h, config)
        except KvpdError as e:
            out.append(f"  {escape(h.name)}: {escape(str(e))}")
            continue
        t = r.target
        hops = " -> ".join(
            f"{j.user}@{j.address}:{j.port}" + (f" (key {j.keys[0]})" if j.keys else "")
            for j in r.jumps
        )
        via = f"through jump host {hops}" if hops else "direct"
        key = f", key {t.keys[0]}" if t.keys else ", agent/~/.ssh keys"
        out.append(escape(f"  {h.name}: {via} to {t.user}@{t.address}:{t.port}{key}"))
    return out


def files_line(plan: Plan, host: str, paths: list[str]) -> str:
    """A host's rendered files; relative paths are relative to its run dir, where `up` writes
    them and starts every process (so the files refer to each other relatively)."""
    run_dir = next((h.run_dir for h in plan.hosts if h.name == host), "")
    if not run_dir.startswith("/"):
        run_dir += " under the login directory"
    return (
        f"[bold]{escape(host)}[/bold] files (relative paths are in its run dir "
        f"{escape(run_dir)}): {escape(', '.join(paths))}"
    )
