"""Fresh prompts for every measured run: the cache state each protocol assumes.

The random dataset of `vllm bench serve` draws its prompts from `--seed`. With one seed for
every run, a re-run, the next scenario or the next sweep point finds its prompts (or their
leading blocks) already in the caches an earlier run filled: vLLM's HBM prefix cache of a
running deployment, UCM's `storage_backends`, kvpd's store, the memcache and Mooncake pools.
The prefix protocol then measures ~100% hits instead of the guide's 0.8, and a "cold" run is
warm.

kvpd therefore gives each (run, scenario, sweep point) its own seed, derived from `bench.seed`
and a salt drawn once per `kvpd bench` (recorded in the results, so a run can be repeated):
its prompts were never sent before, whatever any cache holds, and the phases of one protocol
share it (the prefix protocol's seeding and measured phases, `twice`'s cold and warm). This was
chosen over a fresh store namespace per run because one mechanism covers every cache at once,
including vLLM's own prefix cache (which no store namespace resets) and stores on shared
storage kvpd does not own and must not empty, and it needs no restart. The proof
(`kvpd.bench.proof.hit_ratio_problems`) still checks each phase's measured hit ratio against
its protocol, so contamination from any other source fails the run.
"""

from __future__ import annotations

import hashlib
import secrets

SEED_LIMIT = 2**31  # vLLM's random dataset seeds NumPy: below 2**32, kept signed-safe


def new_salt() -> int:
    return secrets.randbelow(SEED_LIMIT)


def fresh_seed(base: int, salt: int, scenario: str, point_key: str) -> int:
    """The `--seed` of one scenario's sweep point in one run (same inputs, same seed)."""
    text = f"{base}\0{salt}\0{scenario}\0{point_key}".encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "big") % SEED_LIMIT
