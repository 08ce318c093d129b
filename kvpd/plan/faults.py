"""Fault injection switches a profile can set (test only), named in the plan wherever set.

They live in the environment of the processes they act on, so a profile turns them on with
`env:` like any other variable; the plan says so loudly, as a deployment that runs one is
broken on purpose.
"""

from __future__ import annotations

from collections.abc import Iterable

from kvpd.plan.value import ProcessSpec

# name -> what it does (kvpd.connectors.fault and kvpd.testing.standin_engine read them)
SWITCHES = {
    "KVPD_FAULT_CORRUPT_LOADED_BLOCKS": "kvpd's store connector corrupts the KV blocks it loads "
    "after their checksum passed (the /metrics proof still passes)",
    "KVPD_FAULT_EMPTY_COMPLETIONS": "the stand-in engine answers every completion with zero tokens",
}


def warnings(processes: Iterable[ProcessSpec]) -> list[str]:
    """One line per process that runs with a fault injection switch on."""
    out = []
    for p in processes:
        for key, value in p.env:
            if key in SWITCHES and value:
                out.append(
                    f"FAULT INJECTION: {p.name} runs with {key}={value}: {SWITCHES[key]}, on "
                    "purpose, for tests. Remove it from the profile's env for a real deployment."
                )
    return out
