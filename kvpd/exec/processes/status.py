"""What `status` reports of each recorded process, asked of its host (alive, healthy, ports)."""

from __future__ import annotations

from dataclasses import dataclass

from kvpd.exec.fanout import Fanout
from kvpd.exec.processes.health import probe
from kvpd.exec.processes.planner_report import PlannerReport, expected_planner, read_report
from kvpd.exec.processes.stop import is_running
from kvpd.exec.processes.supervised import Supervised
from kvpd.exec.state import DeploymentState, ProcessRecord
from kvpd.exec.transport import Transport, Transports


@dataclass
class ProcessStatus:
    name: str
    host: str
    pid: int
    alive: bool | None  # None: the host could not be asked
    healthy: bool | None  # None: no health check, or not alive
    uptime_s: float | None
    ports: list[int]
    listening: list[int]
    log: str
    detail: str = ""
    supervisor: Supervised | None = None  # set by the service for supervised processes
    # A sparse-offload decode: the planner the plan asks for, and what its log says it runs.
    planner_planned: str | None = None
    planner: PlannerReport | None = None


def _planner_of(t: Transport, log: str) -> PlannerReport | None:
    try:
        return read_report(t, log)
    except Exception:  # noqa: BLE001 - a log that cannot be read is "not reported"
        return None


def query_status(
    state: DeploymentState,
    transports: Transports,
    pool: Fanout,
    now: float,
    probe_timeout_s: float,
) -> list[ProcessStatus]:
    """Each recorded process: alive, healthy (one quick probe), uptime, listening ports."""

    def one(rec: ProcessRecord) -> ProcessStatus:
        st = ProcessStatus(rec.name, rec.host, rec.pid, None, None, None, rec.ports, [], rec.log)
        try:
            t = transports[rec.host]
            st.alive = is_running(t, rec)
            st.listening = t.ports_listening(rec.ports) if rec.ports else []
        except Exception as e:  # noqa: BLE001 - show the others even if one host is down
            st.detail = f"host unreachable: {e}"
            return st
        spec = next((p for p in state.plan.processes if p.name == rec.name), None)
        st.planner_planned = expected_planner(spec)
        if st.alive:
            st.uptime_s = max(0.0, now - rec.started_at)
            if st.planner_planned is not None:
                st.planner = _planner_of(t, rec.log)
            h = spec.health if spec is not None else None
            if h is not None and not h.url and h.ready_port is not None:  # no HTTP endpoint
                up = h.ready_port in (t.ports_listening([h.ready_port]) or [])
                st.healthy = up
                st.detail = f"port {h.ready_port} {'listens' if up else 'does not listen'}"
            elif h is not None:
                pr = probe(t, h, timeout_s=probe_timeout_s)
                st.healthy, st.detail = pr.ok, pr.detail
        return st

    return pool.map(one, state.processes)
