"""Which deployment a verb acts on, and the plan it acts with.

`status`, `logs`, `restart`, `diagnose` and `down` act on what the hosts record, checked
against a plan built now: from PROFILE (with --inventory, --set, --rehearse as `up` had them),
so any controller with the profile can act; or, given only a deployment's name, from the
recipe the local cache keeps (the profile, inventory and overrides `up` was given). The cache
is trusted no more than a host record: the recipe's files must be the user's own and not
writable by others, and the plan they build now must have the digest the cache recorded, so a
tampered or stale cache never decides what runs on the hosts; the cached plan itself is never
used.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from kvpd.errors import StateError

if TYPE_CHECKING:
    from kvpd.exec.state import StateStore
    from kvpd.plan.value import Plan

INVENTORY = typer.Option(
    None, "--inventory", help="The inventory `up` was given (when PROFILE is a profile)."
)
SETS = typer.Option([], "--set", help="The --set overrides `up` was given.")
REHEARSE = typer.Option(False, "--rehearse", help="The deployment was started with --rehearse.")
REHEARSE_WITH = typer.Option(
    None, "--rehearse-with", help="The deployment was started with --rehearse-with ENGINE."
)


def recipe(
    profile: str, inventory: str | None, sets: list[str], rehearse: bool | str
) -> dict[str, Any]:
    """How `up` built its plan, for the cache: paths made absolute (a later verb may run from
    elsewhere), a bundled profile's name kept as it is."""
    return {
        "profile": os.path.abspath(profile) if os.path.exists(profile) else profile,
        "inventory": os.path.abspath(inventory) if inventory else None,
        "sets": list(sets),
        "rehearse": rehearse,
        "base_dir": os.getcwd(),
    }


def build(
    profile: str, *, inventory: str | None, sets: list[str], rehearse: bool | str, base_dir: str
) -> Plan:
    from kvpd.plan.build import load_plan

    return load_plan(profile, rehearse=rehearse, inventory=inventory, sets=sets,
                     base_dir=base_dir, scenarios=False)  # fmt: skip


def _own_file(path: str | None, what: str) -> None:
    from kvpd.exec.state_check import check_owner

    if path and os.path.exists(path):
        check_owner(Path(path), what)


def from_cache(store: StateStore, name: str) -> Plan:
    """The plan of cached deployment `name`, built again from its recipe (see above)."""
    state = store.require(name)
    r = state.recipe
    if not r or not isinstance(r.get("profile"), str):
        raise StateError(
            f"the cached state of {name!r} ({store.path(name)}) does not say which profile "
            f"started it (an older kvpd wrote it). Give the profile: kvpd <verb> PROFILE "
            "[--inventory FILE] [--set ...] as `up` had them."
        )
    _own_file(r["profile"], "profile the cache names")
    _own_file(r.get("inventory"), "inventory the cache names")
    plan = build(r["profile"], inventory=r.get("inventory"), sets=list(r.get("sets") or []),
                 rehearse=r.get("rehearse") or False,
                 base_dir=str(r.get("base_dir") or os.getcwd()))  # fmt: skip
    if plan.deployment != name or plan.profile_digest != state.profile_digest:
        raise StateError(
            f"{r['profile']} no longer plans what `up` started as {name!r} (plan "
            f"{state.profile_digest} then, {plan.profile_digest} now). Give the profile to act "
            f"with what it says now: kvpd <verb> {r['profile']} [--inventory FILE]."
        )
    return plan


def resolve(
    profile: str | None,
    deployment: str | None,
    store: StateStore,
    *,
    inventory: str | None = None,
    sets: list[str] | None = None,
    rehearse: bool | str = False,
) -> tuple[str, Plan]:
    """(deployment name, plan): PROFILE is a profile when it is not a cached deployment's name
    or when --inventory/--set/--rehearse say how to build it; else a name (or none: the only
    cached deployment), whose plan the cache's recipe builds."""
    known = store.deployments()
    if profile and (inventory or sets or rehearse or profile not in known):
        plan = build(profile, inventory=inventory, sets=list(sets or []), rehearse=rehearse,
                     base_dir=os.getcwd())  # fmt: skip
        if deployment and deployment != plan.deployment:
            raise StateError(f"{profile} plans deployment {plan.deployment!r}, not {deployment!r}")
        return plan.deployment, plan
    name = deployment or profile
    if not name:
        if len(known) != 1:
            listed = f" ({', '.join(known)})" if known else ""
            raise StateError(
                f"{len(known)} deployments under {store.root}{listed}: give the PROFILE "
                "(with --inventory as `up` had it) or a deployment name."
            )
        name = known[0]
    return name, from_cache(store, name)
