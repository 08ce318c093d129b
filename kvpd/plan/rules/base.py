"""What every rule module shares: the finding type and the checker rules append to."""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from kvpd.plan.facts import Facts, GroupFacts
from kvpd.plan.layout import Layout
from kvpd.plan.processes import ProcessDraft
from kvpd.profile.schema import Group, Profile

Path_ = tuple[str | int, ...]


@dataclass(frozen=True)
class Finding:
    """One problem: `path` is the profile field it is about; warnings do not stop the plan.
    `on_hardware`: about the real hardware (Ascend protocols, NPU port ranges, HCCL/MemFabric
    addresses), so moot where the deployment runs on other hardware (a rehearsal)."""

    path: Path_
    message: str
    error: bool = True
    on_hardware: bool = False


class Checker:
    """Collects findings over one `Facts` value; rules read facts through it."""

    def __init__(self, facts: Facts) -> None:
        self.f = facts
        self.p: Profile = facts.profile
        self.layout: Layout = facts.layout
        self.procs: tuple[ProcessDraft, ...] = facts.procs
        self.findings: list[Finding] = []

    def err(self, path: Path_, msg: str, *, on_hardware: bool = False) -> None:
        self.findings.append(Finding(tuple(path), msg, True, on_hardware))

    def warn(self, path: Path_, msg: str, *, on_hardware: bool = False) -> None:
        self.findings.append(Finding(tuple(path), msg, False, on_hardware))

    def groups(self) -> list[tuple[str, Group]]:
        return [(g.role, g.group) for g in self.f.groups]

    def gfacts(self) -> tuple[GroupFacts, ...]:
        return self.f.groups

    def known_host(self, name: str) -> bool:
        return name in self.p.hosts

    def suggest_host(self, name: str) -> str:
        close = difflib.get_close_matches(name, list(self.p.hosts), n=1, cutoff=0.5)
        return f" Did you mean '{close[0]}'?" if close else ""
