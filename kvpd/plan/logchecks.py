"""Which log lines confirm at runtime what the plan configured (pure): the guides' own checks.

The layerwise guide says buffer reuse is on when the prefill log shows `Layerwise KV cache reuse
merged ...`; the UCM guide says prefix-cache hits show as `hit external: N` per request (kvpd's
store connector logs the same words). `kvpd bench` reads the logs and checks them.
"""

from __future__ import annotations

from kvpd.plan.facts import Facts
from kvpd.plan.processes import ProcessDraft
from kvpd.plan.rehearsal_mode import REAL, Rehearsal
from kvpd.plan.value import LogCheck
from kvpd.profile.roles import PREFILLING_ROLES

# Connectors whose per-request log line carries `hit external` (UCMConnector, kvpd's store).
HIT_LOGGERS = frozenset({"ucm", "kvpd_store"})
# Replaced by a rehearsal (they need Ascend): their log lines cannot appear there.
SUBSTITUTED = frozenset({"ucm", "ascend_store"})


def log_checks(
    facts: Facts,
    procs: tuple[ProcessDraft, ...] | list[ProcessDraft],
    rehearsal: Rehearsal = REAL,
) -> tuple[LogCheck, ...]:
    out: list[LogCheck] = []
    for p in procs:
        g = facts.group(p.role)
        if g is None or p.role not in PREFILLING_ROLES:
            continue
        real = set(g.connectors) - (SUBSTITUTED if rehearsal.on else set())
        lw = g.group.layerwise
        if (
            "ascend_store" in real
            and lw is not None
            and lw.use_layerwise
            and lw.num_shared_buffers is not None  # unset: one buffer per layer, no reuse
            and lw.independent_layers != "all"  # "all" disables reuse
        ):
            out.append(LogCheck(p.name, "layerwise_reuse"))
        if real & HIT_LOGGERS:
            out.append(LogCheck(p.name, "store_hits"))
    return tuple(out)
