"""Live progress of a bench run with rich: scenario, sweep point, phase, elapsed time."""

from __future__ import annotations

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

from kvpd.bench.settings import Point


class RichProgress:
    """Implements session.Progress. One bar over all phases; the description says where the
    run is. Use as a context manager."""

    def __init__(self, console: Console) -> None:
        self._p = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        )
        self._task = self._p.add_task("bench", total=None)

    def __enter__(self) -> RichProgress:
        self._p.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._p.stop()

    def start(self, total_phases: int) -> None:
        self._p.update(self._task, total=total_phases)

    def status(self, text: str) -> None:
        self._p.update(self._task, description=text)

    def phase(self, scenario: str, point: Point, phase: str) -> None:
        c = "" if point.max_concurrency is None else f" c={point.max_concurrency}"
        self._p.update(
            self._task,
            description=f"{scenario} · in {point.input_len} out {point.output_len}{c} · {phase}",
        )

    def advance(self) -> None:
        self._p.advance(self._task)
