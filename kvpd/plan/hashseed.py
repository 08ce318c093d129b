"""One PYTHONHASHSEED for every engine that shares a UCM store (pure).

vLLM seeds its prefix-cache block-hash chain from PYTHONHASHSEED (`NONE_HASH`), a random value
per process when it is unset. UCM stores blocks under those hashes, so two instances (or two
DP engine cores) without one seed never find each other's blocks: decode misses everything
prefill stored. Where no group's environment sets it, kvpd sets the same value for every engine
of the groups that use UCM (a plan warning says so); a value the profile sets always wins.
"""

from __future__ import annotations

import dataclasses

from kvpd.plan.layout import merged
from kvpd.plan.processes import ProcessDraft
from kvpd.profile.roles import ENGINE_ROLES
from kvpd.profile.schema import Profile

NAME = "PYTHONHASHSEED"
SEED = "0"
SHARED_STORES = frozenset({"ucm"})


def seeded_groups(profile: Profile) -> list[str]:
    """The groups kvpd gives its seed: they use a shared store and none of them sets one."""
    users = []
    for role in ENGINE_ROLES:
        g = profile.group(role)
        if g is None or not SHARED_STORES & set(g.kv_connectors):
            continue
        env = {**profile.env, **(merged(profile, g).env or {})}
        if NAME in env:
            return []  # the profile chose (a differing value is the consistency rule's)
        users.append(str(role))
    return users


def pin_hash_seed(profile: Profile, procs: list[ProcessDraft]) -> list[ProcessDraft]:
    roles = set(seeded_groups(profile))
    if not roles:
        return procs
    return [
        dataclasses.replace(p, env=(*p.env, (NAME, SEED))) if p.role in roles else p for p in procs
    ]
