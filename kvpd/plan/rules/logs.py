"""`log_name` rules: a valid template, and one log file per process (pure)."""

from __future__ import annotations

from kvpd.plan.lognames import log_file, template_problem
from kvpd.plan.rules.base import Checker


def rule_log_names(c: Checker) -> None:
    bad: set[str] = set()
    for role, g in c.groups():
        if g.log_name is not None:
            problem = template_problem(g.log_name)
            if problem:
                c.err((role, "log_name"), problem)
                bad.add(role)
    if c.layout.problems:
        return
    # The other processes' logs (services, proxy: logs/<name>.log) on their hosts first.
    engines = {ep.name for ep in c.layout.procs}
    seen: dict[tuple[str, str], str] = {
        (p.host, f"logs/{p.name}.log"): p.name for p in c.procs if p.name not in engines
    }
    for ep in c.layout.procs:
        g = c.p.engine_group(ep.role)
        if ep.role in bad:
            continue
        key = (ep.host, log_file(g.log_name, ep))
        other = seen.setdefault(key, ep.name)
        if other != ep.name:
            fix = (
                "put {dp_rank} or {name} into log_name so each process has its own log."
                if other in engines
                else f"that is {other}'s log; choose another log_name, e.g. {{name}}.log."
            )
            c.err(
                (ep.role, "log_name"),
                f"{other} and {ep.name} on {ep.host} would both write {key[1]}; {fix}",
            )
            bad.add(ep.role)
