"""How `kvpd plan` and `kvpd status` show the node bundle (kvpd on the hosts that need it)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.table import Table

from kvpd.plan.bundle import ENGINE_SLOT
from kvpd.plan.value import Plan

if TYPE_CHECKING:
    from kvpd.exec.bundle.result import BundleSlot


def _python(spec: str) -> str:
    return f"python of `{spec[1:]}`" if spec.startswith("@") else spec


def plan_lines(plan: Plan) -> list[str]:
    """The hosts that get the bundle, with which Python, for which processes and why."""
    if not plan.bundle:
        return []
    lines = [
        "[bold]node bundle[/bold] (`up` installs kvpd into <run dir>/bundle; on PYTHONPATH of "
        "these processes only):"
    ]
    builders = {h.name for h in plan.hosts if h.bundle_builder}
    for u in plan.bundle:
        native = {"required": "; native core required", "preferred": "; native core preferred"}
        lines.append(
            f"  {u.host} ({u.slot} slot, {_python(u.python)}): {'; '.join(u.why)}"
            + native.get(u.native, "")
            + ("; its wheel build serves its platform's hosts" if u.host in builders else "")
        )
    return lines


def fallback_warning(row: BundleSlot, profile: str) -> str | None:
    """The warning for an engine slot left on the NumPy fallback, with the way to the native
    core: `up` replaces the fallback by itself once a native wheel can be had, but does not
    retry a build that failed for this kvpd (its wheel cache remembers the failure)."""
    if row.slot != ENGINE_SLOT or row.implementation == "native":
        return None
    from kvpd.exec.bundle.wheel import cache_dir

    platform = row.platform
    head = (
        f"{row.host}: kvpd's native core is not available for {platform} "
        f"({row.native.get('reason')}); engines there use the NumPy fallback"
    )
    if row.compiler:
        return (
            f"{head}. A build of the core for {platform} failed before and is not retried: "
            f"fix it (that `up` warned why), remove {cache_dir() / 'wheels'}/*/{platform} on "
            f"this machine and run `kvpd up {profile}` again."
        )
    from kvpd.exec.cross_build import platform_target

    cross = (
        " Or, for this platform, give this controller the cross toolchain (`bash "
        "scripts/install-aarch64.sh` as root): `kvpd up` then cross-builds the core here."
        if platform_target(str(platform)) is not None
        else ""
    )
    return (
        f"{head}. Install g++ and the Python headers (python3-dev) on a host of that platform "
        "(on this machine for its own): the next `kvpd up` builds the core and replaces the "
        f"fallback.{cross}"
    )


def status_table(rows: list[BundleSlot]) -> Table:
    """What `up` verified per host slot: interpreter, digest, native implementation, and where
    its wheel came from (the controller, a host's build, the cache)."""
    from kvpd.exec.bundle.host import origin

    t = Table(title="node bundle")
    for col in ("Host", "Slot", "Python", "Digest", "Native", "Wheel from", "Up did", "Seconds"):
        t.add_column(col)
    for r in rows:
        impl = r.implementation or "-"
        isa = r.native.get("isa_flags")
        if r.native.get("ascend_planner"):  # the row planner's path: avx512..., neon, baseline
            isa = f"{isa}; planner {r.native['ascend_planner']}" if isa else None
        t.add_row(
            r.host,
            r.slot,
            f"{r.executable or r.python} {r.version or ''}".strip(),
            (r.digest or "-")[:12],
            f"{impl} ({isa})" if isa else impl,
            origin(r.source),
            r.action,
            f"{r.seconds:.2f}",
        )
    return t
