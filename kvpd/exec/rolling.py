"""Rolling restart: one process at a time, the service answering throughout.

For each process: drain it at the proxy (no new requests; in-flight ones finish, bounded),
stop it, start it again from its launch script, gate on its health, re-admit it, wait until the
proxy routes to it again, then prove P/D with the canary. Re-admitting comes before the canary
because the canary goes through the proxy: with one instance in a group, a drained backend
could not serve it. The proxy itself is not drained (nothing routes to it): its restart window
is the only time clients see refused connections.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from kvpd.errors import DeployError
from kvpd.exec.executor import Executor
from kvpd.exec.fanout import Fanout
from kvpd.exec.proxy_admin import ProxyAdmin
from kvpd.exec.records.current import Current
from kvpd.exec.state import DeploymentState
from kvpd.exec.transport import Transports
from kvpd.plan.value import Plan, ProcessSpec
from kvpd.profile.roles import DECODING_ROLES, ENGINE_ROLES, Role

ENGINES = ENGINE_ROLES


class CanaryOutcome(Protocol):
    """What a canary says (kvpd.bench.canary.CanaryResult is one)."""

    ok: bool
    line: str
    problems: list[str]

    def to_dict(self) -> dict[str, Any]: ...  # what `up --json` reports as "canary"


# The canary reaches the proxy and the engines' /metrics through the hosts' transports.
CanaryCheck = Callable[[Plan, Transports], CanaryOutcome]


@dataclass
class Step:
    """What happened to one process."""

    name: str
    drained: bool | None = None  # None: not behind the proxy
    seconds: float = 0.0
    canary: str = ""
    notes: list[str] = field(default_factory=list)


def proxy_backend_names(plan: Plan) -> dict[str, str]:
    """Process name -> the proxy's backend name. The proxy numbers its backends per pool in
    the order of its --prefiller/--decoder lists, which are the plan's engine order."""
    out: dict[str, str] = {}
    pre = [p for p in plan.processes if p.role == Role.PREFILL]
    dec = [p for p in plan.processes if p.role in DECODING_ROLES]
    out.update({p.name: f"prefill-{i}" for i, p in enumerate(pre)})
    out.update({p.name: f"decode-{i}" for i, p in enumerate(dec)})
    return out


def select(plan: Plan, targets: list[str]) -> list[ProcessSpec]:
    """Processes named by NAME or GROUP (role: prefill, decode, mixed, proxy), in plan order;
    every process when `targets` is empty. Engines first, the proxy last."""
    roles = {p.role for p in plan.processes}
    names = {p.name for p in plan.processes}
    bad = [t for t in targets if t not in names and t not in roles]
    if bad:
        known = ", ".join(sorted(names | roles))
        raise DeployError(f"no process or group {', '.join(bad)} (known: {known}).")
    chosen = [p for p in plan.processes
              if not targets or p.name in targets or p.role in targets]  # fmt: skip
    return sorted(chosen, key=lambda p: p.role == Role.PROXY)


def refuse_drifted(specs: list[ProcessSpec], current: Current) -> None:
    """DeployError unless every process to restart is recorded and was launched as the plan
    (built from the profile now) launches it: a restart starts the launch script `up` wrote
    into the run dir, so a process whose launch differs would come back as it ran before, not
    as the profile says. Refused records are refused here too."""
    if current.refused:
        raise DeployError("restart refused: " + "\n".join(current.refused.values()))
    recorded = {r.name for r in current.state.processes}
    missing = [s.name for s in specs if s.name not in recorded]
    drifted = [s.name for s in specs if s.name in current.drift.processes]
    if missing:
        raise DeployError(
            f"restart refused: no host records {', '.join(missing)} (not running, or started "
            "by no kvpd `up` of this profile). Start the deployment with `kvpd up`."
        )
    if drifted:
        raise DeployError(
            f"restart refused: {', '.join(drifted)} ran from a launch the profile given no "
            "longer plans (drift). `kvpd down` then `kvpd up` starts what the profile says now."
        )


class Roller:
    def __init__(
        self,
        ex: Executor,
        state: DeploymentState,
        admin: ProxyAdmin | None,
        canary: Callable[[], tuple[bool, str]] | None,
        *,
        drain_timeout_s: float = 60.0,
        readmit_timeout_s: float = 60.0,
        save: Callable[[], None] = lambda: None,
    ) -> None:
        self.ex = ex
        self.state = state
        self.admin = admin
        self.canary = canary
        self.drain_timeout_s = drain_timeout_s
        self.readmit_timeout_s = readmit_timeout_s
        self.save = save
        self.backends = proxy_backend_names(state.plan)

    def restart(self, spec: ProcessSpec) -> Step:
        t0 = time.monotonic()
        step = Step(spec.name)
        backend = self.backends.get(spec.name) if spec.role in ENGINES else None
        if backend and self.admin is not None:
            r = self.admin.drain(backend, self.drain_timeout_s)
            step.drained = bool(r.get("drained"))
            if not step.drained:
                step.notes.append(
                    f"{r.get('inflight')} requests still in flight after {self.drain_timeout_s:g}s"
                )
        self._stop_start(spec)
        if backend and self.admin is not None:
            self.admin.admit(backend)
            self._wait_routable(backend)
        if self.canary is not None:
            ok, line = self.canary()
            step.canary = line
            if not ok:
                raise DeployError(f"after restarting {spec.name}: {line}")
        step.seconds = time.monotonic() - t0
        return step

    def _stop_start(self, spec: ProcessSpec) -> None:
        ex, state = self.ex, self.state
        old = state.record(spec.name)
        with Fanout(1) as pool:
            if old is not None:
                result = ex._stopper(pool).stop([old])  # the executor's one way
                if result.leftover or result.busy_ports:
                    raise DeployError(f"{spec.name} did not stop: {result.leftover or ''} "
                                      f"ports {result.busy_ports}")  # fmt: skip
                state.processes.remove(old)
            started = ex._start_one(state, spec)  # records it, as `up` does
            try:
                ex._wait_stage([spec], [started], pool)  # the health gate
            except Exception as e:  # noqa: BLE001 - any failure of the gate: not back
                reason = getattr(e, "reason", str(e))
                raise DeployError(f"{spec.name} did not come back: {reason}") from None
        rec = state.record(spec.name)
        if rec is not None:
            rec.status = "healthy"
        self.save()

    def _wait_routable(self, backend: str) -> None:
        """Until the proxy's own health check has seen the backend healthy again."""
        assert self.admin is not None
        end = time.monotonic() + self.readmit_timeout_s
        while time.monotonic() < end:
            rows = {b["backend"]: b for b in self.admin.backends()}
            b = rows.get(backend, {})
            if b.get("healthy") and b.get("circuit") == "closed" and not b.get("draining"):
                return
            time.sleep(0.2)
        raise DeployError(
            f"the proxy did not take {backend} back within {self.readmit_timeout_s:g}s "
            f"(its state: {rows.get(backend)})"
        )
