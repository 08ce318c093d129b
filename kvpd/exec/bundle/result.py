"""What the bundle step found and did per host slot, and the verdict on it: which slots cannot
be served, with the fix for each (kvpd.exec.bundle.installer does the work)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvpd.errors import DeployError
from kvpd.plan.bundle import BundleUse


@dataclass
class SlotResult:
    """What the bundle step found and did for one slot (recorded in the deployment state)."""

    host: str
    slot: str
    python: str  # as the plan says it
    report: dict[str, Any] = field(default_factory=dict)  # the node script's last JSON line
    action: str = "kept"  # kept | installed | failed
    source: str = ""  # where the installed wheel came from: local | cache | host:NAME | any
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return bool(self.report.get("ready"))

    def to_dict(self) -> dict[str, Any]:
        native = self.report.get("native") or {}
        return {
            "host": self.host,
            "slot": self.slot,
            "python": self.python,
            "executable": self.report.get("executable"),
            "version": self.report.get("version"),
            "platform": self.report.get("platform"),
            "digest": self.report.get("digest"),
            "folder": self.report.get("folder"),
            "implementation": native.get("implementation"),
            "compiler": self.report.get("compiler"),
            "native": native,
            "action": self.action,
            "source": self.source,
            "seconds": round(self.seconds, 3),
            "problem": self.report.get("problem", ""),
        }


def judge(results: list[SlotResult], uses: dict[tuple[str, str], BundleUse]) -> None:
    """Raise DeployError listing every slot that cannot be served, each with its fix."""
    problems = []
    for r in results:
        u = uses[(r.host, r.slot)]
        rep = r.report
        where = f"{r.host} ({r.slot}: {u.python})"
        if not r.ok:
            fix = fix_hint(rep)
            problems.append(f"{where}: {rep.get('problem', 'not installed')}. {fix}")
        elif u.native == "required" and (rep.get("native") or {}).get("implementation") != "native":
            problems.append(
                f"{where}: the kvpd planner needs the native core, but this host got the "
                "NumPy fallback. Install g++ and the Python headers on a host of platform "
                f"{rep.get('platform')} (the next `up` builds the core there and replaces the "
                "fallback), or set decode.sparse_offload.planner: upstream."
            )
    if problems:
        raise DeployError("node bundle: " + "\n  ".join(["", *problems]).lstrip("\n "))


def fix_hint(rep: dict[str, Any]) -> str:
    if rep.get("too_old"):
        return "Use a Python >= 3.10 for this process (e.g. set the profile's python)."
    if rep.get("problem") == "interpreter not found":
        return "Install it or set its full path in the profile."
    if rep.get("platform") and not rep.get("pip"):
        return f"Install pip for {rep.get('executable')} (python -m ensurepip)."
    return "See the message; `kvpd up` retries the install."
