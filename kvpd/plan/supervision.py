"""How a supervised process is launched: the one place that spells the supervisor's command.

A group (or the proxy) with `restart: {policy: on-failure}` gets its launch script's command
wrapped as `python3 -m kvpd.supervisor --status supervise/NAME.json ... -- COMMAND`. The python
is the host's own (`python_for`); it imports kvpd from the node bundle, which `up` installs for
every supervised process and puts on its PYTHONPATH (kvpd.plan.bundle).
"""

from __future__ import annotations

from kvpd.plan.rehearsal_mode import Rehearsal
from kvpd.profile.roles import ENGINE_ROLES, Role
from kvpd.profile.schema import Profile, RestartPolicy

STATUS_DIR = "supervise"  # relative to the host's run dir (launch scripts cd there)
GRACE_S = 10.0  # child SIGTERM -> SIGKILL; below `kvpd down`'s default grace (20 s)


def python_for(profile: Profile, rehearsal: Rehearsal) -> str:
    """The python that runs the supervisor on the hosts (the one of kvpd's other node-side
    processes); the supervisor needs nothing but the standard library and the bundle."""
    return rehearsal.python(profile)


def status_path(name: str) -> str:
    return f"{STATUS_DIR}/{name}.json"


def policy_for(profile: Profile, role: str) -> RestartPolicy | None:
    """The restart policy of a process of `role` (None or `never`: not supervised)."""
    if role == Role.PROXY:
        pol = profile.proxy.restart if profile.proxy is not None else None
    else:
        group = profile.group(role) if role in ENGINE_ROLES else None
        pol = getattr(group, "restart", None)
    return pol if pol is not None and pol.policy != "never" else None


def supervisor_argv(
    python: str, name: str, policy: RestartPolicy, ready_url: str = ""
) -> tuple[str, ...]:
    """The words before `COMMAND` in a supervised launch script. `ready_url`: the process's
    health URL; a process that exits before it ever answered is not restarted."""
    ready = ("--ready-url", ready_url) if ready_url else ()
    return (
        python, "-m", "kvpd.supervisor",
        "--status", status_path(name),
        "--name", name,
        "--restart", policy.policy,
        "--max-restarts", str(policy.max_restarts),
        "--window", f"{policy.window_s:g}",
        "--backoff", f"{policy.backoff_s:g}",
        "--grace", f"{GRACE_S:g}",
        *ready,
        "--",
    )  # fmt: skip
