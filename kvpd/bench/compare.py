"""Differences between two saved runs (`--compare A B`) and the regression gate."""

from __future__ import annotations

from dataclasses import dataclass

from rich.table import Table

from kvpd.bench.records import BenchRun, Record
from kvpd.bench.serve_output import value

# (label, metric, stat or result key, lower_is_better)
COMPARED: tuple[tuple[str, str, str, bool], ...] = (
    ("TTFT mean", "ttft", "mean", True),
    ("TTFT p99", "ttft", "p99", True),
    ("TPOT mean", "tpot", "mean", True),
    ("E2EL mean", "e2el", "mean", True),
    ("output tok/s", "output_throughput", "", False),
    ("req/s", "request_throughput", "", False),
)
# What the gate checks by default: the guide's columns plus throughput.
GATED = ("TTFT mean", "TPOT mean", "E2EL mean", "output tok/s")


@dataclass(frozen=True)
class Diff:
    record: str
    metric: str
    a: float
    b: float
    lower_is_better: bool

    @property
    def change(self) -> float:
        """Relative change b vs a (+0.1 = 10 % higher)."""
        return (self.b - self.a) / self.a if self.a else 0.0

    @property
    def regression(self) -> float:
        """How much worse b is than a (positive = worse), as a fraction of a."""
        return self.change if self.lower_is_better else -self.change


def _get(r: Record, metric: str, stat: str) -> float | None:
    if stat:
        return value(r.result, metric, stat)
    v = r.result.get(metric)
    return float(v) if isinstance(v, (int, float)) else None


def diffs(a: BenchRun, b: BenchRun, metrics: tuple[str, ...] | None = None) -> list[Diff]:
    """Every compared metric of every measured record present (and ok) in both runs."""
    index = {r.key: r for r in a.measured}
    out = []
    for rb in b.measured:
        ra = index.get(rb.key)
        if ra is None:
            continue
        for label, metric, stat, lower in COMPARED:
            if metrics is not None and label not in metrics:
                continue
            va, vb = _get(ra, metric, stat), _get(rb, metric, stat)
            if va is None or vb is None:
                continue
            out.append(Diff(rb.label, label, va, vb, lower))
    return out


def unmatched(a: BenchRun, b: BenchRun) -> tuple[list[str], list[str]]:
    ka, kb = {r.key for r in a.measured}, {r.key for r in b.measured}
    return (
        [r.label for r in a.measured if r.key not in kb],
        [r.label for r in b.measured if r.key not in ka],
    )


def compare_table(a: BenchRun, b: BenchRun, name_a: str = "A", name_b: str = "B") -> Table:
    t = Table(title=f"{name_a} -> {name_b}")
    for col in ("record", "metric", name_a, name_b, "change"):
        t.add_column(col, justify="left" if col in ("record", "metric") else "right")
    for d in diffs(a, b):
        color = "green" if d.regression < -0.005 else "red" if d.regression > 0.005 else "dim"
        t.add_row(d.record, d.metric, f"{d.a:,.2f}", f"{d.b:,.2f}", f"[{color}]{d.change:+.1%}[/]")
    return t
