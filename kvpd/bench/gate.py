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
    problems += [f"{label}: outputs failed in the baseline (not a baseline)"
                 for label in baseline.outputs_failed()]  # fmt: skip
    wrong = current.outputs_failed()
    problems += [f"{label}: outputs differ from a single engine's (not a result)"
                 for label in wrong]  # fmt: skip
    return problems


def refuse_wrong_outputs(runs: dict[str, BenchRun]) -> None:
    """A run whose output check failed measured wrong output: it is neither a baseline nor
    something to compare (its latency may be that of garbage)."""
    bad = {name: r.outputs_failed() for name, r in runs.items()}
    bad = {name: labels for name, labels in bad.items() if labels}
    if bad:
        lines = [f"  - {name}: {', '.join(labels)}" for name, labels in bad.items()]
        raise BenchError(
            "refusing to compare: the output check failed in these runs (the P/D path "
            "generated something else than a single engine), so their numbers are not "
            "results:\n" + "\n".join(lines) + "\nFix the deployment and bench it again."
        )


def gate(baseline: BenchRun, current: BenchRun, max_regression: float) -> None:
    problems = regressions(baseline, current, max_regression)
    if problems:
        raise BenchError(
            f"regression gate failed ({len(problems)} problem(s), max {max_regression:.0%}):\n"
            + "\n".join(f"  - {p}" for p in problems)
        )
