"""Stopping recorded processes: SIGTERM to the process group, grace period, SIGKILL, verify."""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from kvpd.exec.fanout import Fanout
from kvpd.exec.report import Reporter
from kvpd.exec.state import ProcessRecord
from kvpd.exec.transport import Transport, Transports

KILL_WAIT_S = 5.0  # after SIGKILL: how long to wait for the kernel to take the group down
POLL_S = 0.1
PORT_WAIT_S = 2.0  # listening sockets close with the process; allow a moment to settle


def is_running(t: Transport, rec: ProcessRecord) -> bool:
    """True while the recorded process or any member of its group lives (zombies count as
    gone). A different process under the leader's PID means ours ended: the kernel does not
    reuse a PID while a process group of that number still has members."""
    if t.alive(rec.pid):
        return t.alive(rec.pid, start_ticks=rec.start_ticks)
    return bool(t.group_alive(rec.pgid))


# How stopping one process ended: "stopped" by SIGTERM, "killed" by SIGKILL, or "error" (the
# host could not be asked). The first three mean the process is gone.
StopHow = Literal["not running", "stopped", "killed", "still running", "error"]


@dataclass
class StopOutcome:
    name: str
    host: str
    how: StopHow
    detail: str = ""

    @property
    def gone(self) -> bool:
        return self.how in ("not running", "stopped", "killed")


@dataclass
class StopResult:
    outcomes: list[StopOutcome] = field(default_factory=list)
    busy_ports: dict[str, list[int]] = field(default_factory=dict)  # host -> still listening

    @property
    def leftover(self) -> list[StopOutcome]:
        return [o for o in self.outcomes if not o.gone]

    @property
    def nothing_was_running(self) -> bool:
        return all(o.how == "not running" for o in self.outcomes)


class Stopper:
    """Stops records in reverse stage order; within a stage in parallel."""

    def __init__(
        self,
        transports: Transports,
        reporter: Reporter,
        pool: Fanout,
        *,
        grace_s: float,
        clock: Callable[[], float],
        sleep: Callable[[float], None],
    ) -> None:
        self.transports = transports
        self.reporter = reporter
        self.pool = pool
        self.grace_s = grace_s
        self.clock = clock
        self.sleep = sleep

    def stop(self, records: list[ProcessRecord]) -> StopResult:
        result = StopResult()
        for stage in sorted({r.stage for r in records}, reverse=True):
            batch = [r for r in records if r.stage == stage]
            result.outcomes.extend(self.pool.map(self._stop_one, batch))
        result.busy_ports = self._busy_ports([r for r in records if r.ports])
        return result

    def _stop_one(self, rec: ProcessRecord) -> StopOutcome:
        try:
            return self._stop_guarded(rec)
        except Exception as e:  # noqa: BLE001 - an unreachable host must not stop the others
            self.reporter.process(rec.name, "failed", host=rec.host, detail=str(e))
            return StopOutcome(rec.name, rec.host, "error", str(e))

    def _stop_guarded(self, rec: ProcessRecord) -> StopOutcome:
        t = self.transports[rec.host]
        if not is_running(t, rec):
            detail = "not running"
            if t.alive(rec.pid):  # the recorded start time is not this PID's: never signalled
                detail = (f"not running: PID {rec.pid} is another process now (its start time "
                          "is not the recorded one), left alone")  # fmt: skip
            self.reporter.process(rec.name, "stopped", host=rec.host, detail=detail)
            return StopOutcome(rec.name, rec.host, "not running", detail)
        self.reporter.process(rec.name, "stopping", host=rec.host, detail="SIGTERM")
        t.signal_group(rec.pgid, signal.SIGTERM, start_ticks=rec.start_ticks)
        if self._wait_gone(t, rec, self.grace_s):
            self.reporter.process(rec.name, "stopped", host=rec.host, detail="SIGTERM")
            return StopOutcome(rec.name, rec.host, "stopped")
        self.reporter.process(
            rec.name,
            "stopping",
            host=rec.host,
            detail=f"SIGKILL (still running {self.grace_s:g}s after SIGTERM)",
        )
        t.signal_group(rec.pgid, signal.SIGKILL, start_ticks=rec.start_ticks)
        if self._wait_gone(t, rec, KILL_WAIT_S):
            self.reporter.process(rec.name, "stopped", host=rec.host, detail="SIGKILL")
            return StopOutcome(rec.name, rec.host, "killed")
        left = t.group_alive(rec.pgid)
        detail = f"PIDs {left} of group {rec.pgid} survived SIGKILL"
        self.reporter.process(rec.name, "failed", host=rec.host, detail=detail)
        return StopOutcome(rec.name, rec.host, "still running", detail)

    def _wait_gone(self, t: Transport, rec: ProcessRecord, within_s: float) -> bool:
        deadline = self.clock() + within_s
        while is_running(t, rec):
            if self.clock() >= deadline:
                return False
            self.sleep(POLL_S)
        return True

    def _busy_ports(self, records: list[ProcessRecord]) -> dict[str, list[int]]:
        wanted: dict[str, list[int]] = {}
        for r in records:
            wanted.setdefault(r.host, []).extend(r.ports)
        busy: dict[str, list[int]] = {}
        for host, ports in wanted.items():
            deadline = self.clock() + PORT_WAIT_S
            try:
                while True:
                    left = self.transports[host].ports_listening(sorted(set(ports)))
                    if not left or self.clock() >= deadline:
                        break
                    self.sleep(POLL_S)
            except Exception:  # noqa: BLE001 - reported via the process outcomes already
                continue
            if left:
                busy[host] = left
        return busy


@dataclass
class DownResult:
    deployment: str
    stop: StopResult = field(default_factory=StopResult)
    containers_left: list[str] = field(default_factory=list)  # kvpd-started, not removed
    # hosts whose record was refused (records/validate.py): nothing there was signalled
    refused: list[str] = field(default_factory=list)

    @property
    def nothing_running(self) -> bool:
        return self.stop.nothing_was_running

    @property
    def clean(self) -> bool:
        left = self.stop.leftover or self.stop.busy_ports or self.containers_left
        return not left and not self.refused
