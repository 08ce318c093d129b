"""The lease around the deployment service's changing verbs (`up`, `down`, `restart`, rolling
restarts), so two controllers never change one deployment at once (kvpd.exec.lease.host).

`Leasing` gives the service `lease(plan, operation)` (a context that holds the lease, renewed in
the background, and releases it on the way out) and `peek_lease(plan)` (what `--break-lease`
shows before asking). `@leased(verb=operation, ...)` on the service class makes each named verb
hold the lease for its whole run. Holding is re-entrant per deployment: `restart` (stop, then
up) and a CLI that took the lease first (to break one, or to cover its prompt and canary too)
hold one lease, not two. Read-only verbs (`status`, `logs`, `diagnose`, `plan --check`) take
none.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from kvpd.errors import TransportError
from kvpd.exec.lease import host as lease_host
from kvpd.exec.lease.host import UNLEASED, Held, HostLease, LeaseHostError, Renewer
from kvpd.exec.lease.model import LEASE_MAX_S, LEASE_MIN_S, Decision, Operation, Seen, decide
from kvpd.exec.service_hosts import PlanTransports
from kvpd.exec.state import StateStore
from kvpd.plan.value import Plan

T = TypeVar("T")


def ttl_of(plan: Plan) -> int:
    """The plan's lease time to live within kvpd's bounds (a state file's plan is a cache)."""
    return max(LEASE_MIN_S, min(LEASE_MAX_S, int(plan.lease_s)))


def _unreachable(plan: Plan, host: str, e: Exception) -> LeaseHostError:
    dep = plan.deployment
    return LeaseHostError(
        f"cannot take the lease of deployment {dep!r} on its lease host {host} (the first of its "
        f"hosts by name): {e}. Without it another controller could change {dep!r} at the same "
        "time. Fix that, or pass --break-lease to go on without a lease"
    )


class Leasing(PlanTransports):
    """Mixin of the deployment service: the leases it holds, by deployment."""

    store: StateStore

    def _held(self) -> dict[str, Renewer | None]:
        # Made on first use: the mixin needs no __init__, so the service's stays its own.
        return self.__dict__.setdefault("_leases_held", {})  # type: ignore[no-any-return]

    def _host_lease(self, plan: Plan) -> HostLease:
        # On the host itself, never inside its container: kvpd starts and removes containers
        # during the very changes the lease covers, and the lease lives in the login's home.
        t = self.transports(plan).host_transport(lease_host.lease_host(plan))
        return HostLease(t, plan.deployment)

    def peek_lease(self, plan: Plan) -> tuple[Seen, Decision]:
        """The lease of `plan`'s deployment as it is, and whether this controller may take it
        (LeaseHostError when its host cannot be asked)."""
        try:
            seen = self._host_lease(plan).read()
        except TransportError as e:
            raise _unreachable(plan, lease_host.lease_host(plan), e) from e
        here = lease_host.me()
        gone = lease_host.gone_here(lease_host.parsed(seen.content), here)
        return seen, decide(seen, here, ttl_s=ttl_of(plan), gone=gone)

    @contextmanager
    def lease(
        self, plan: Plan, operation: Operation, *, take_over: str = ""
    ) -> Iterator[Held | None]:
        """Hold the lease of `plan`'s deployment for `operation` (LeaseHeld naming its holder
        when another change holds it; LeaseHostError when its host cannot be asked, unless
        `take_over` is UNLEASED: then nothing is held). `take_over`: the target
        (Seen.target) the user confirmed breaking. Raises LeaseLost after the body when the
        lease was taken over meanwhile."""
        held = self._held()
        if plan.deployment in held:
            renewer = held[plan.deployment]
            yield renewer.held if renewer else None
            return
        renewer = self._take(plan, operation, take_over)
        held[plan.deployment] = renewer
        done = False
        try:
            yield renewer.held if renewer else None
            done = True
        finally:
            del held[plan.deployment]
            why = renewer.release() if renewer else ""
        if done and why:
            raise lease_host.lost_error(plan.deployment, why)

    def _take(self, plan: Plan, operation: Operation, take_over: str) -> Renewer | None:
        try:
            host = self._host_lease(plan)
            got = lease_host.take(host, operation, ttl_s=ttl_of(plan), take_over=take_over)
        except TransportError as e:
            if take_over == UNLEASED:
                return None
            raise _unreachable(plan, lease_host.lease_host(plan), e) from e
        return Renewer(got).start()


def _plan_of(service: Any, target: Any, given: Any) -> Plan | None:
    """The plan whose lease a verb takes: the one it was given (built from the profile now),
    else the cache's record of the deployment it names."""
    if isinstance(target, Plan):
        return target
    if isinstance(given, Plan):
        return given
    state = service.store.load(target) if isinstance(target, str) else None
    return state.plan if state is not None else None


def leased(**verbs: Operation) -> Callable[[type[T]], type[T]]:
    """Class decorator: each method named in `verbs` holds the lease for its operation. The
    method's first argument is the plan, or a deployment name: then its `plan=` argument (the
    plan built from the profile, when the verb acts from the hosts' records), else the cache's
    recorded plan (neither: nothing to change, no lease)."""

    def wrap(method: Callable[..., Any], op: Operation) -> Callable[..., Any]:
        @functools.wraps(method)
        def holding(self: Any, target: Any, *args: Any, **kwargs: Any) -> Any:
            plan = _plan_of(self, target, kwargs.get("plan"))
            if plan is None:
                return method(self, target, *args, **kwargs)
            with self.lease(plan, op):
                return method(self, target, *args, **kwargs)

        return holding

    def decorate(cls: type[T]) -> type[T]:
        for name, op in verbs.items():
            setattr(cls, name, wrap(getattr(cls, name), op))
        return cls

    return decorate
