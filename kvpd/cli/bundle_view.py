"""How `kvpd plan` and `kvpd status` show the node bundle (kvpd on the hosts that need it)."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from kvpd.plan.value import Plan


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
    for u in plan.bundle:
        native = {"required": "; native core required", "preferred": "; native core preferred"}
        lines.append(
            f"  {u.host} ({u.slot} slot, {_python(u.python)}): {'; '.join(u.why)}"
            + native.get(u.native, "")
        )
    return lines


def fallback_warning(row: dict[str, Any], profile: str) -> str | None:
    """The warning for an engine slot left on the NumPy fallback, with the way to the native
    core. A bundle `up` verified is kept as it is, so once the host can build (a compiler and
    the Python headers) the fallback stays until `down --purge` removes it."""
    if row.get("slot") != "engine" or row.get("implementation") == "native":
        return None
    head = (
        f"{row['host']}: kvpd's native core is not available for {row.get('platform')} "
        f"({(row.get('native') or {}).get('reason')}); engines there use the NumPy fallback"
    )
    again = f"`kvpd down --purge {profile}` and `kvpd up {profile}`"
    if row.get("compiler"):
        return f"{head}. The host can build it now: {again} rebuild the bundle with it."
    return (
        f"{head}. For the native core install g++ and the Python headers (python3-dev) "
        f"there, then {again}."
    )


def status_table(rows: list[dict[str, Any]]) -> Table:
    """What `up` verified per host slot: interpreter, digest, native implementation."""
    t = Table(title="node bundle")
    for col in ("Host", "Slot", "Python", "Digest", "Native", "Up did", "Seconds"):
        t.add_column(col)
    for r in rows:
        impl = r.get("implementation") or "-"
        isa = (r.get("native") or {}).get("isa_flags")
        t.add_row(
            r["host"],
            r["slot"],
            f"{r.get('executable') or r['python']} {r.get('version') or ''}".strip(),
            (r.get("digest") or "-")[:12],
            f"{impl} ({isa})" if isa else impl,
            r.get("action", ""),
            f"{r.get('seconds', 0):.2f}",
        )
    return t
