"""Every bench scenario of a profile is a profile too: its `sets` (and the connectors its
`without` detaches) applied to the profile must pass the same schema and rules, or `kvpd plan`
refuses it now instead of `kvpd bench` failing on it after the scenarios before it have run."""

from __future__ import annotations

from collections.abc import Callable

from kvpd.errors import ProfileError
from kvpd.profile.load import Source
from kvpd.profile.roles import ENGINE_ROLES
from kvpd.profile.schema import Profile


def detach_sets(
    connectors: dict[str, list[str]], without: tuple[str, ...]
) -> tuple[list[str], list[str], str | None]:
    """`--set` values that detach `without` from every group, the connectors detached, and the
    group (if any) whose only connector that would take away in a P/D deployment: its P->D
    path, which a scenario may not remove. `connectors` is each group's kv_connectors."""
    sets: list[str] = []
    removed: list[str] = []
    pd = "prefill" in connectors and "decode" in connectors
    for group in ENGINE_ROLES:
        have = connectors.get(group)
        if have is None:
            continue
        keep = [c for c in have if c not in without]
        if keep == have:
            continue
        if pd and not keep:
            return sets, removed, group
        removed += [c for c in have if c in without and c not in removed]
        sets.append(f"{group}.kv_connectors=[{', '.join(keep)}]")
    return sets, removed, None


def group_connectors(profile: Profile) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for role in ENGINE_ROLES:
        g = profile.group(role)
        if g is not None:
            out[role] = list(g.kv_connectors)
    return out


def check_scenarios(
    profile: Profile, source: Source, sets: list[str], build: Callable[[list[str]], object]
) -> None:
    """Build each scenario of `profile` with `build(extra_sets)` (the caller's load and build,
    so this module imports neither); raise one ProfileError naming every scenario that fails."""
    problems: list[str] = []
    connectors = group_connectors(profile)
    for name, scn in profile.bench.scenarios.items():
        extra, _, blocked = detach_sets(connectors, tuple(scn.without))
        if blocked is not None:
            where = source.where(("bench", "scenarios", name, "without"))
            gone = [k for k in connectors[blocked] if k in scn.without]
            problems.append(
                f"{where}: bench.scenarios.{name}.without: detaching {', '.join(gone)} leaves "
                f"{blocked} without a KV connector: {' + '.join(connectors[blocked])} is the only "
                "P->D path of this deployment, so decode would get no KV. Remove it from "
                "`without` and compare what this deployment can (sets, cache: none|hbm|external)."
            )
            continue
        more = [*sets, *scn.sets, *extra, "bench.scenarios={}"]
        try:
            build(more)
        except ProfileError as e:
            where = source.where(("bench", "scenarios", name))
            what = ", ".join([*scn.sets, *extra]) or "nothing"
            problems += [
                f"{where}: bench.scenarios.{name}: the profile with this scenario's changes "
                f"({what}) is refused: {p} Fix the scenario (or the profile)."
                for p in e.problems
            ]
    if problems:
        raise ProfileError(problems)
