"""The benchmarks' result tables: a header, a rule as wide as it, one line a row (shared by
proxy_overhead.py and prefix_routing.py, which import it from this folder)."""

from __future__ import annotations

from collections.abc import Iterable


def print_table(head: str, lines: Iterable[str]) -> None:
    """Print `head`, a rule of dashes as long, then each of `lines`."""
    print(head)
    print("-" * len(head))
    for line in lines:
        print(line)
