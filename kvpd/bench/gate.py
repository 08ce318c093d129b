"""The regression gate: `--baseline FILE --max-regression 10%` fails when a metric got worse."""

from __future__ import annotations

from kvpd.bench.compare import GATED, diffs, unmatched
from kvpd.bench.records import BenchRun
from kvpd.errors import BenchError


def parse_percent(text: str) -> float:
    """ "10%" or "10" -> 0.10 (a bare number is a percentage too)."""
    s = str(text).strip().rstrip("%").strip()
    try:
        v = float(s)
    except ValueError:
        raise BenchError(
            f"--max-regression: expected a percentage like 10%, got {text!r}."
        ) from None
    if v < 0:
        raise BenchError(f"--max-regression must not be negative, got {text!r}.")
    return v / 100.0


def regressions(
    baseline: BenchRun,
    current: BenchRun,
    max_regression: float,
    metrics: tuple[str, ...] = GATED,
) -> list[str]:
    """Messages for every gated metric worse than the baseline by more than `max_regression`,
    and for baseline records the current run lacks (a gate must not pass by omission)."""
    problems = []
    for d in diffs(baseline, current, metrics):
        if d.regression > max_regression:
            problems.append(
                f"{d.record}: {d.metric} {d.a:,.2f} -> {d.b:,.2f} "
                f"({d.regression:+.1%} worse, allowed {max_regression:.0%})"
            )
    missing, _ = unmatched(baseline, current)
    problems += [f"{label}: in the baseline but not in this run" for label in missing]
    bad = [r.label for r in current.measured if not r.ok]
    problems += [f"{label}: failed in this run (not a result)" for label in bad]
    return problems


def gate(baseline: BenchRun, current: BenchRun, max_regression: float) -> None:
    problems = regressions(baseline, current, max_regression)
    if problems:
        raise BenchError(
            f"regression gate failed ({len(problems)} problem(s), max {max_regression:.0%}):\n"
            + "\n".join(f"  - {p}" for p in problems)
        )
