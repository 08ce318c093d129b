"""How `kvpd plan` shows containers on the nodes: per host, the runtime `exec` every
command goes through and the `run` line that starts the container (copyable)."""

from __future__ import annotations

import shlex

from kvpd.plan.value import Plan


def plan_lines(plan: Plan) -> list[str]:
    lines: list[str] = []
    for h in plan.hosts:
        c = h.container
        if c is None:
            continue
        if not lines:
            lines.append(
                "[bold]containers[/bold] (every command for these hosts' processes "
                "runs through the runtime's exec):"
            )
        kind = "namespace STAND-IN for tests, not a container runtime" if c.standin else c.runtime
        who = (
            "kvpd starts it in `up`, removes it in `down`"
            if c.started_by_kvpd
            else ("you run it; kvpd only execs into it")
        )
        lines.append(f"  {h.name}: container {c.name} ({kind}; {who})")
        lines.append(f"    exec: {shlex.join(c.exec_argv(['sh', '-c', '...']))}")
        lines.append(f"    run:  {shlex.join(c.run_argv())}")
    return lines
