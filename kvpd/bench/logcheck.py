"""The guides' runtime confirmations, read from the engines' logs after a scenario's phases.

- `Layerwise KV cache reuse merged ...` in a prefill log where the plan turned layerwise buffer
  reuse on (vLLM-Ascend logs it when it lays the KV cache out); missing means reuse is off.
- `hit external: N` (UCMConnector) / `hit external N` (kvpd's store connector), once per
  request: the sum is what the store served. A scenario that must hit the store (cache:
  external) and whose logs show none has not used it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from kvpd.plan.value import LogCheck
from kvpd.profile.bench_schema import CacheCheck

LAYERWISE = re.compile(r"Layerwise KV cache reuse merged \d+ descriptors into \d+ descriptors")
HITS = re.compile(r"hit hbm:? (\d+), hit external:? (\d+)")


@dataclass
class Confirmation:
    """What the logs showed for one scenario: notes to print and problems that fail the run."""

    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def store_hits(text: str) -> tuple[int, int, int]:
    """(requests logged, HBM hit blocks, external hit blocks) from a log's `hit` lines."""
    n = hbm = ext = 0
    for m in HITS.finditer(text):
        n += 1
        hbm += int(m.group(1))
        ext += int(m.group(2))
    return n, hbm, ext


def confirm(
    scenario: str,
    checks: tuple[LogCheck, ...],
    read_log: Callable[[str], str | None],
    cache: CacheCheck | None,
) -> Confirmation:
    """Check `checks` against the processes' logs (`read_log(process)`: its tail, or None when
    it cannot be read)."""
    out = Confirmation()
    where = f"scenario {scenario!r}"
    totals = [0, 0, 0]
    hit_procs: list[str] = []
    for chk in checks:
        text = read_log(chk.process)
        if text is None:
            out.notes.append(f"{where}: could not read the log of {chk.process}.")
            continue
        if chk.kind == "layerwise_reuse":
            if LAYERWISE.search(text):
                out.notes.append(f"{where}: {chk.process}: layerwise KV cache reuse is on.")
            else:
                out.problems.append(
                    f"{where}: {chk.process}: no `Layerwise KV cache reuse merged ...` line in "
                    "its log although layerwise.num_shared_buffers asks for buffer reuse: "
                    "reuse is off (fewer reusable layers than buffers, or an older "
                    f"vLLM-Ascend). See `kvpd logs {chk.process}`."
                )
        elif chk.kind == "store_hits":
            hit_procs.append(chk.process)
            for i, v in enumerate(store_hits(text)):
                totals[i] += v
    if hit_procs:
        n, hbm, ext = totals
        out.notes.append(
            f"{where}: store log lines of {len(hit_procs)} engine(s): {n} requests, "
            f"hit hbm {hbm}, hit external {ext} blocks."
        )
        if cache == "external" and ext == 0:
            out.problems.append(
                f"{where}: the store connector's logs ({', '.join(hit_procs[:4])}"
                f"{', ...' if len(hit_procs) > 4 else ''}) show "
                + ("no `hit external` line at all" if n == 0 else "zero `hit external` blocks")
                + " although this scenario must hit the external store. See `kvpd logs "
                f"{hit_procs[0]}`."
            )
    return out
