"""How the executor reports progress: the `Reporter` protocol the CLI renders, and its phases.

Every verb that acts on hosts (up, down, restart, the bundle install, containers, file
writing) reports through this one protocol, so it lives apart from any of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, Protocol, TypedDict

if TYPE_CHECKING:  # annotations only (typing.Unpack is 3.11+)
    from typing_extensions import Unpack

# Where a process (or a host's bundle install) is: starting -> waiting / initialising ->
# healthy | failed on the way up; stopping -> stopped | failed on the way down.
Phase = Literal["starting", "waiting", "initialising", "healthy", "failed", "stopping", "stopped"]


class Progress(TypedDict, total=False):
    """What a progress report may say besides the process and its phase (stated once)."""

    host: str
    detail: str
    elapsed_s: float | None


class Reporter(Protocol):
    """Receives progress; the CLI renders it. Called from worker threads. The bodies do
    nothing, so a reporter that drops progress is a plain subclass (`NullReporter`)."""

    def process(self, name: str, phase: Phase, **info: Unpack[Progress]) -> None:
        return None

    def message(self, text: str) -> None:
        return None


class NullReporter(Reporter):
    """Drops all progress (library callers and tests that render nothing)."""
