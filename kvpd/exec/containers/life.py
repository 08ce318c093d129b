"""Containers kvpd starts (`container: {image: ...}`): started before the first stage of `up`,
removed by `down` and by a rolled-back `up` once everything inside is stopped.

Only containers carrying kvpd's label with this deployment's name are ever removed or reused:
a container of the same name that kvpd did not start is left alone and reported.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvpd.errors import DeployError, TransportError
from kvpd.exec.containers.transport import ContainerTransport, runtime_failure
from kvpd.exec.report import Reporter
from kvpd.exec.transport import Transport, Transports
from kvpd.plan.container import ContainerSpec
from kvpd.plan.value import HostSpec, Plan


@dataclass(frozen=True)
class Inspected:
    status: str  # running, exited, created, ...
    image: str  # image ID (digest) the container runs
    label: str  # kvpd's deployment label, empty when kvpd did not start it


def host_side(t: Transport) -> Transport:
    """The host's own transport under a container transport (runtime commands run there)."""
    return t.inner if isinstance(t, ContainerTransport) else t


def inspect(t: Transport, spec: ContainerSpec, host: str) -> Inspected | None:
    """The container's state on the host; None when there is no such container."""
    r = t.run(spec.inspect_argv(), timeout_s=60)
    if not r.ok:
        missing_runtime = r.exit_code == 127 and spec.command.lower() in r.stderr.lower()
        if not missing_runtime and "no such container" in (r.stderr + r.stdout).lower():
            return None
        raise TransportError(
            runtime_failure(spec, host, r)
            or f"host {host}: `{spec.command} inspect {spec.name}` failed: {r.stderr.strip()}"
        )
    lines = (r.stdout.splitlines() + ["", "", ""])[:3]
    return Inspected(lines[0].strip(), lines[1].strip(), lines[2].strip())


def _ours(plan: Plan) -> list[HostSpec]:
    return [h for h in plan.hosts if h.container is not None and h.container.started_by_kvpd]


def start_containers(plan: Plan, transports: Transports, reporter: Reporter) -> None:
    """Make every container kvpd starts for `plan` run (idempotent: one of ours already
    running is kept; a stopped one of ours is replaced)."""
    for h in _ours(plan):
        spec = h.container
        assert spec is not None
        t = host_side(transports[h.name])
        got = inspect(t, spec, h.name)
        if got is not None and got.label != plan.deployment:
            raise DeployError(
                f"host {h.name}: a container named {spec.name!r} exists that kvpd did not start "
                f"for {plan.deployment!r} (label {got.label or 'none'}). Fix: remove it "
                f"(`{spec.command} rm -f {spec.name}`) or set hosts.{h.name}.container.name."
            )
        if got is not None and got.status == "running":
            continue
        if got is not None:
            t.run(spec.rm_argv(), timeout_s=120)
        reporter.message(f"{h.name}: starting container {spec.name} ({spec.image})")
        r = t.run(spec.run_argv(), timeout_s=1800)  # may pull the image first
        if not r.ok:
            raise DeployError(
                runtime_failure(spec, h.name, r)
                or f"host {h.name}: starting container {spec.name} failed "
                f"(exit {r.exit_code}): {r.stderr.strip()[-500:]}"
            )


def remove_containers(plan: Plan, transports: Transports, reporter: Reporter) -> list[str]:
    """Remove the containers kvpd started for `plan`; what could not be removed, one sentence
    each (a container without our label is never touched)."""
    problems = []
    for h in _ours(plan):
        spec = h.container
        assert spec is not None
        try:
            t = host_side(transports[h.name])
            got = inspect(t, spec, h.name)
            if got is None:
                continue
            if got.label != plan.deployment:
                reporter.message(f"{h.name}: container {spec.name} is not kvpd's: left alone")
                continue
            r = t.run(spec.rm_argv(), timeout_s=120)
            if not r.ok:
                raise TransportError(r.stderr.strip() or f"exit {r.exit_code}")
            reporter.message(f"{h.name}: removed container {spec.name}")
        except Exception as e:  # noqa: BLE001 - report every host's outcome
            problems.append(f"container {spec.name} on {h.name} not removed: {e}")
    return problems
