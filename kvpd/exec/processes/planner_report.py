"""Which sparse KV planner a decode process says it runs: the line its engine logs when the
planner is loaded, read from the process's log on its host.

The bundle check (`up`) proves that the node bundle's native core imports on a host; this is
the process's own word, after it started: vLLM-Ascend's manager patched by kvpd's plugin logs
"Sparse KV offload planner: kvpd's native core (..., neon row planner), no JIT build" (or
"vLLM-Ascend's own ..." when it kept its JIT build), and kvpd's stand-in decode logs the same
words. The log is the host's text, so only the two known forms and the known row-planner names
are accepted; anything else reads as "not reported".
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kvpd.exec.transport import Transport
from kvpd.plan.sparse_planner import ENV as PLANNER_ENV
from kvpd.plan.sparse_planner import Planner
from kvpd.plan.value import ProcessSpec

MARKER = "sparse kv offload planner:"  # compared case-insensitively
ROW_PLANNERS = ("avx512_vpopcnt", "avx512", "avx2", "sve", "neon", "baseline")
_LINE = re.compile(r"sparse kv offload planner: (kvpd's native core|vllm-ascend's own)", re.I)
_ISA = re.compile(r"\(([^()]{0,200}?)\b([a-z0-9_]{1,20}) row planner\b")
# Only the end of a long grep result is looked at: the last start is the current process.
_MAX_TEXT = 64 * 1024


@dataclass(frozen=True)
class PlannerReport:
    """What the process logged: whose planner, and kvpd's row-planner path if kvpd's."""

    planner: Planner
    isa: str | None = None

    @property
    def label(self) -> str:
        if self.planner == "upstream":
            return "vLLM-Ascend's own"
        return f"kvpd {self.isa}" if self.isa else "kvpd"


def expected_planner(spec: ProcessSpec | None) -> str | None:
    """The planner the plan asks of this process (`kvpd`, `upstream`, `auto`), or None when it
    runs no sparse KV offload planner."""
    if spec is None:
        return None
    return next((v for k, v in spec.env if k == PLANNER_ENV), None)


def parse_report(text: str) -> PlannerReport | None:
    """The last planner line in `text` (a log's lines), or None when there is none."""
    found: PlannerReport | None = None
    for line in text[-_MAX_TEXT:].splitlines():
        m = _LINE.search(line)
        if m is None:
            continue
        if m.group(1).lower().startswith("vllm"):
            found = PlannerReport("upstream")
            continue
        isa = _ISA.search(line[m.end() :])
        name = isa.group(2) if isa is not None else None
        found = PlannerReport("kvpd", name if name in ROW_PLANNERS else None)
    return found


def read_report(t: Transport, log: str, *, timeout_s: float = 15) -> PlannerReport | None:
    """The planner line of the process log at `log` on the transport's host, if any."""
    if not log:
        return None
    r = t.run(["grep", "-a", "-i", "-F", "--", MARKER, log], timeout_s=timeout_s)
    if r.exit_code not in (0, 1):  # 1: no such line; anything else: unreadable
        return None
    return parse_report(r.stdout)
