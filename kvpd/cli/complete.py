"""Shell completion of deployment and process names (typer calls these on <TAB>).

They read only the local state files: completion must be instant and never touch a host.
"""

from __future__ import annotations

import typer


def deployments(incomplete: str) -> list[str]:
    from kvpd.exec.state import StateStore

    try:
        return [d for d in StateStore().deployments() if d.startswith(incomplete)]
    except OSError:
        return []


def processes(ctx: typer.Context, incomplete: str) -> list[str]:
    """Process names of the deployment already on the command line, else of every one; the
    deployment names too where the first word may still be one."""
    from kvpd.errors import KvpdError
    from kvpd.exec.state import StateStore

    store = StateStore()
    given = [a for a in (ctx.params.get("targets") or []) if a != incomplete]
    try:
        known = store.deployments()
        names = [given[0]] if given and given[0] in known else known
        out: list[str] = [] if given else [d for d in known if d.startswith(incomplete)]
        for d in names:
            state = store.load(d)
            if state is not None:
                out += [p.name for p in state.plan.processes if p.name.startswith(incomplete)]
        return sorted(set(out))
    except (OSError, KvpdError):
        return []
