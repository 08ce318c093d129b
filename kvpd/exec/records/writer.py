"""Keeping each host's record in step with what kvpd does there.

`up` writes a host's record as each process on it starts (before its health gate, so a killed
`up` leaves records a later `down` finds), `restart` rewrites it when a process comes back
under a new PID, and `down` (and the rollback of a failed `up`) removes it once nothing kvpd
started runs on that host, or rewrites it with what is left. One lock per host: records of
processes starting at once on one host are written one after the other, each from the whole
state at that moment, so a slower write never puts back an older record.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from kvpd.exec.records import hostio
from kvpd.exec.records.model import HostRecord, RecordedProcess, launch_digest
from kvpd.exec.transport import Transports
from kvpd.plan.value import Plan
from kvpd.profile.roles import Role

if TYPE_CHECKING:
    from kvpd.exec.state import DeploymentState, ProcessRecord


def host_record(
    state: DeploymentState, host: str, gone: frozenset[str] = frozenset()
) -> HostRecord | None:
    """What `host`'s record says for `state`: its processes not stopped (nor in `gone`, those
    a stop saw go); None when none is left."""
    run_dir = state.run_dirs.get(host)
    procs = [r for r in state.processes
             if r.host == host and r.status != "stopped" and r.name not in gone]  # fmt: skip
    if not run_dir or not procs:
        return None
    return HostRecord(
        deployment=state.deployment,
        host=host,
        run_dir=run_dir,
        plan_digest=state.profile_digest,
        started_by=state.started_by,
        started_at=state.created_at,
        updated_at=time.time(),
        processes=[_recorded(state.plan, r) for r in procs],
    )


def _recorded(plan: Plan, r: ProcessRecord) -> RecordedProcess:
    spec = plan.process(r.name)
    return RecordedProcess(
        name=r.name,
        role=Role(spec.role),
        stage=r.stage,
        pid=r.pid,
        pgid=r.pgid,
        start_ticks=r.start_ticks,
        ports=list(r.ports),
        devices=list(spec.devices),
        log=r.log,
        started_at=r.started_at,
        launch_digest=r.launch_digest or launch_digest(plan, spec),
        status=r.status,
    )


class RecordSync:
    """Writes (or removes) one host's record from the state, one host at a time."""

    def __init__(self, transports: Transports, state_lock: threading.Lock) -> None:
        self.transports = transports
        self._state_lock = state_lock  # the executor's: guards the state being changed
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def _lock(self, host: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(host, threading.Lock())

    def index(self, state: DeploymentState, host: str) -> None:
        """Name the run dir in the host's index before anything starts there."""
        hostio.write_index(self.transports[host], state.deployment, state.run_dirs[host])

    def sync(self, state: DeploymentState, host: str, gone: frozenset[str] = frozenset()) -> None:
        """Make `host`'s record say what `state` says of it."""
        with self._lock(host):
            with self._state_lock:
                record = host_record(state, host, gone)
                run_dir = state.run_dirs.get(host, "")
            t = self.transports[host]
            if record is not None:
                hostio.write(t, record)
            elif run_dir:
                hostio.remove(t, run_dir, state.deployment)

    def sync_all(
        self, state: DeploymentState, each: Callable[..., list[str]], gone: set[str] | None = None
    ) -> list[str]:
        """Every host of `state` (through `each`, a Fanout's map); what could not be written."""
        dropped = frozenset(gone or ())

        def one(host: str) -> str:
            try:
                self.sync(state, host, dropped)
            except Exception as e:  # noqa: BLE001 - reported; the stop itself already happened
                return f"{host}: the host record could not be updated ({e})"
            return ""

        return [p for p in each(one, sorted(state.run_dirs)) if p]
