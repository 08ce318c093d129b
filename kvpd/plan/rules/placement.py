"""Whether the layout uses what the profile lists: no idle host, no idle devices."""

from __future__ import annotations

from kvpd.plan.layout import dp_size_local, host_devices
from kvpd.plan.rules.base import Checker
from kvpd.profile.schema import ASCEND


def rule_idle_hosts(c: Checker) -> None:
    """A listed host without an engine of its group is a mistake unless the profile says so:
    `pack` fills the first hosts, and a host a newcomer listed for capacity then idles."""
    if c.layout.problems:
        return
    for role, g in c.groups():
        if g.allow_idle_hosts or any(h not in c.p.hosts for h in g.hosts):
            continue
        used = {ep.host for ep in c.layout.procs if ep.role == role}
        idle = [h for h in g.hosts if h not in used]
        if not idle:
            continue
        them = "it" if len(idle) == 1 else "them"
        hint = ""
        if g.placement == "pack" and (g.instances > 1 or g.dp > 1):
            hint = " set `placement: spread` to use every listed host,"
        if g.dp > 1 and g.dp_size_local is None:
            share = -(-g.dp // len(g.hosts))
            hint += f" set `dp_size_local: {share}` to spread an instance's DP ranks,"
        c.err(
            (role, "hosts"),
            f"{role} lists {', '.join(idle)} but its {g.instances} instance(s) of dp {g.dp} x "
            f"tp {g.tp} (placement {g.placement}, dp_size_local {_local(c, role)}) fit on "
            f"{', '.join(h for h in g.hosts if h in used)}, so {', '.join(idle)} would stay "
            f"idle. Remove {them},{hint} raise dp/instances, or set `allow_idle_hosts: true` "
            "if that is intended.",
        )


def _local(c: Checker, role: str) -> int:
    return dp_size_local(c.p, c.p.engine_group(role))


def rule_idle_devices(c: Checker) -> None:
    """Devices of an NPU/GPU host that no engine uses: capacity paid for and left idle."""
    if c.layout.problems:
        return
    taken: dict[str, set[int]] = {}
    for ep in c.layout.procs:
        taken.setdefault(ep.host, set()).update(ep.devices)
    for name in sorted(taken):
        host = c.p.hosts[name]
        hw = host.hardware or c.p.hardware
        if hw not in (*ASCEND, "cuda"):
            continue
        total = host_devices(c.p, host)
        idle = sorted(set(range(total)) - taken[name])
        if idle:
            c.warn(
                ("hosts", name, "devices"),
                f"{len(idle)} of the {total} devices of '{name}' run no engine "
                f"({_ranges(idle)}). Raise dp/tp/instances of a group on it, or set "
                f"`hosts.{name}.devices: {total - len(idle)}` if the rest are not yours.",
                on_hardware=True,
            )


def _ranges(devs: list[int]) -> str:
    runs: list[list[int]] = []
    for d in devs:
        if runs and d == runs[-1][-1] + 1:
            runs[-1].append(d)
        else:
            runs.append([d])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)
