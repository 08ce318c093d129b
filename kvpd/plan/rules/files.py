"""Files and shared state the profile names: the kvpd store's folder, logs of every process,
one hash seed for instances that share a store (pure)."""

from __future__ import annotations

from kvpd.plan.hashseed import SEED, seeded_groups
from kvpd.plan.rules.base import Checker


def rule_store_path(c: Checker) -> None:
    st = c.p.kv.kvpd_store
    if st is not None and not st.path.strip():
        c.err(
            ("kv", "kvpd_store", "path"),
            "is empty, which would put the store into the profile's own folder. Set it to the "
            "store's folder (e.g. /mnt/kv, one shared filesystem for every host that uses it).",
        )


def rule_hash_seed(c: Checker) -> None:
    """vLLM seeds its prefix-cache hash chain from PYTHONHASHSEED (a random root per process
    without it); UCM keys blocks by those hashes, so instances sharing a UCM store need one
    seed. kvpd pins one where the profile sets none (kvpd.plan.hashseed); say so."""
    roles = seeded_groups(c.p)
    if roles:
        c.warn(
            ("env",),
            f"PYTHONHASHSEED is not set, and the engines of {' and '.join(roles)} (every "
            "instance and DP rank) share the UCM store, whose block keys come from vLLM's "
            "prefix-cache hash chain, seeded by PYTHONHASHSEED (random per process without "
            f"it): kvpd sets PYTHONHASHSEED={SEED} for all of them. Set "
            '`env: {PYTHONHASHSEED: "..."}` to choose the value.',
        )
