"""Backends of one role: least-outstanding-tokens choice with round-robin ties, a circuit
breaker per backend, drain for the admin interface, and active health checks.

Three gates decide whether a backend gets new requests, each with its own evidence:
- health (active checks): a failed check or a refused connection takes it out, a passing
  check puts it back;
- the circuit breaker (the requests themselves): `failures` consecutive failed requests
  (timeouts, 5xx, broken streams; a backend whose /health answers while its generation hangs)
  open the circuit; after `cooldown` seconds and a passing health check it is half-open and
  gets one request as a probe: success closes it, failure opens it again;
- drain (the admin interface): no new requests until re-admitted.
Every transition is counted per backend (`kvpd_proxy_backend_transitions_total`)."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvpd.proxy.hostpool import HostPool, fetch
from kvpd.proxy.upstream import UpstreamError

if TYPE_CHECKING:
    from kvpd.proxy.cache_aware import CacheAware

log = logging.getLogger("kvpd.proxy")

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"
TRANSITIONS = ("unhealthy", "healthy", OPEN, HALF_OPEN, CLOSED, "drain", "admit")


class Backend:
    __slots__ = ("name", "pool", "healthy", "circuit", "draining", "inflight", "outstanding",
                 "requests", "errors", "last_error", "consecutive", "opened_at", "probing",
                 "transitions")  # fmt: skip

    def __init__(self, pool: HostPool) -> None:
        self.name = pool.name
        self.pool = pool
        # None = not checked yet: usable for routing, but not counted as ready by GET /health.
        self.healthy: bool | None = None
        self.circuit = CLOSED
        self.draining = False
        self.inflight = 0
        self.outstanding = 0  # estimated tokens of work sent and not finished
        self.requests = 0
        self.errors = 0
        self.last_error = ""
        self.consecutive = 0  # failed requests in a row
        self.opened_at = 0.0
        self.probing = False  # the one half-open probe request is in flight
        self.transitions: Counter[str] = Counter({t: 0 for t in TRANSITIONS})

    @property
    def usable(self) -> bool:
        if self.healthy is False or self.draining:
            return False
        circuit = self.circuit
        return circuit == CLOSED or (circuit == HALF_OPEN and not self.probing)

    @property
    def healthy_num(self) -> int:
        return 1 if self.healthy and self.circuit != OPEN and not self.draining else 0

    def begin(self, tokens: int) -> None:
        self.inflight += 1
        self.outstanding += tokens
        self.requests += 1
        if self.circuit == HALF_OPEN:
            self.probing = True

    def end(self, tokens: int) -> None:
        self.inflight -= 1
        self.outstanding -= tokens
        self.probing = False

    def describe(self) -> dict[str, object]:
        """What /healthcheck shows: the public name, never the address."""
        return {
            "name": self.name,
            "healthy": self.healthy,
            "circuit": self.circuit,
            "draining": self.draining,
            "inflight": self.inflight,
            "outstanding_tokens": self.outstanding,
            "requests": self.requests,
            "errors": self.errors,
            "last_error": self.last_error,
        }


class BackendPool:
    """All backends of one role (`prefill` or `decode`)."""

    def __init__(
        self,
        role: str,
        backends: list[Backend],
        loop: asyncio.AbstractEventLoop,
        breaker_failures: int = 3,
        breaker_cooldown: float = 10.0,
    ) -> None:
        self.role = role
        self.backends = backends
        self.loop = loop
        self.breaker_failures = breaker_failures
        self.breaker_cooldown = breaker_cooldown
        self._next = 0
        # routing by prompt prefix (kvpd/proxy/cache_aware.py); None: least loaded
        self.policy: CacheAware | None = None

    def pick(self, exclude: tuple[Backend, ...] = (), keys: Sequence[int] = ()) -> Backend | None:
        """The backend for a request whose prompt has the prefix `keys`: the pool's policy
        decides when it has one, else the least loaded."""
        if keys and self.policy is not None:
            return self.policy.choose(self, exclude, keys)
        return self.least_loaded(exclude)

    def least_loaded(self, exclude: tuple[Backend, ...] = ()) -> Backend | None:
        """The usable backend with the least outstanding tokens. The scan starts one place
        further on every call, so equal loads rotate instead of always landing on node 0."""
        backends = self.backends
        n = len(backends)
        start = self._next
        self._next = start + 1 if start + 1 < n else 0
        best: Backend | None = None
        for i in range(n):
            b = backends[(start + i) % n]
            if b in exclude or not b.usable:
                continue
            if best is None or b.outstanding < best.outstanding:
                best = b
        return best

    def any_healthy(self) -> bool:
        return any(b.healthy and b.circuit != OPEN and not b.draining for b in self.backends)

    def find(self, name: str) -> Backend | None:
        """By public name (decode-0) or address (host:port)."""
        for b in self.backends:
            if name in (b.name, b.pool.address):
                return b
        return None

    def _move(self, backend: Backend, to: str, why: str = "") -> None:
        backend.transitions[to] += 1
        level = logging.INFO if to in ("healthy", CLOSED, "admit") else logging.WARNING
        log.log(level, "%s %s: %s%s", self.role, backend.name, to, f" ({why})" if why else "")

    # --- evidence from requests --------------------------------------------------------------
    def succeeded(self, backend: Backend) -> None:
        backend.consecutive = 0
        if backend.circuit != CLOSED:
            backend.circuit = CLOSED
            self._move(backend, CLOSED, "probe request succeeded")

    def failed(self, backend: Backend, reason: str, unreachable: bool = False) -> None:
        """A request failed because of the backend. `unreachable` (refused or reset before
        any answer): also out until a health check passes."""
        backend.errors += 1
        backend.last_error = reason
        backend.consecutive += 1
        if unreachable:
            self.mark_down(backend, reason)
        if backend.circuit == HALF_OPEN or (
            backend.circuit == CLOSED and backend.consecutive >= self.breaker_failures
        ):
            backend.circuit = OPEN
            backend.opened_at = self.loop.time()
            self._move(backend, OPEN, f"{backend.consecutive} failed requests in a row: {reason}")

    # --- evidence from health checks ---------------------------------------------------------
    def mark_down(self, backend: Backend, reason: str) -> None:
        backend.last_error = reason
        if backend.healthy is not False:
            backend.healthy = False
            self._move(backend, "unhealthy", reason)

    def mark_up(self, backend: Backend) -> None:
        if backend.healthy is not True:
            if backend.healthy is False:
                self._move(backend, "healthy")
            backend.healthy = True
        if (
            backend.circuit == OPEN
            and self.loop.time() - backend.opened_at >= self.breaker_cooldown
        ):
            backend.circuit = HALF_OPEN
            self._move(backend, HALF_OPEN, "cooldown over and healthy: the next request probes")

    # --- admin -------------------------------------------------------------------------------
    def set_draining(self, backend: Backend, draining: bool) -> None:
        if backend.draining != draining:
            backend.draining = draining
            self._move(backend, "drain" if draining else "admit")

    def close(self) -> None:
        for b in self.backends:
            b.pool.close()


class HealthChecker:
    """GET <path> on every backend every `interval` seconds; 200 = healthy."""

    def __init__(
        self, pools: list[BackendPool], path: str, interval: float, timeout: float
    ) -> None:
        self.pools = pools
        self.path = path.encode()
        self.interval = interval
        self.timeout = timeout
        self.rounds = 0
        self._round_done = asyncio.Event()

    async def check(self, pool: BackendPool, backend: Backend) -> None:
        try:
            resp = await asyncio.wait_for(
                fetch(backend.pool, b"GET", self.path, b"", self.timeout), self.timeout
            )
        except (UpstreamError, asyncio.TimeoutError) as e:
            reason = str(e) or f"health check timed out after {self.timeout:g} s"
            pool.mark_down(backend, f"health check: {reason}")
            return
        if resp.status == 200:
            pool.mark_up(backend)
        else:
            pool.mark_down(backend, f"health check: HTTP {resp.status}")

    async def run_once(self) -> None:
        await asyncio.gather(*(self.check(p, b) for p in self.pools for b in p.backends))
        for pool in self.pools:
            for b in pool.backends:
                b.pool.prune()
        self.rounds += 1
        self._round_done.set()
        self._round_done = asyncio.Event()

    async def wait_round(self) -> None:
        """Wait for the next complete round (tests use it instead of sleeping)."""
        await self._round_done.wait()

    async def run(self) -> None:
        while True:
            try:
                await self.run_once()
            except Exception:  # a bug here must not stop future checks
                log.exception("health check round failed")
            await asyncio.sleep(self.interval)
