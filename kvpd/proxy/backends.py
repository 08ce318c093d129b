"""Backends of one role: least-outstanding-tokens choice with round-robin ties, and active
health checks that take dead backends out and put recovered ones back."""

from __future__ import annotations

import asyncio
import logging

from kvpd.proxy.upstream import HostPool, UpstreamError, fetch

log = logging.getLogger("kvpd.proxy")


class Backend:
    __slots__ = (
        "name",
        "pool",
        "healthy",
        "inflight",
        "outstanding",
        "requests",
        "errors",
        "last_error",
    )

    def __init__(self, pool: HostPool) -> None:
        self.name = pool.name
        self.pool = pool
        # None = not checked yet: usable for routing, but not counted as ready by GET /health.
        self.healthy: bool | None = None
        self.inflight = 0
        self.outstanding = 0  # estimated tokens of work sent and not finished
        self.requests = 0
        self.errors = 0
        self.last_error = ""

    @property
    def usable(self) -> bool:
        return self.healthy is not False

    @property
    def healthy_num(self) -> int:
        return 1 if self.healthy else 0

    def begin(self, tokens: int) -> None:
        self.inflight += 1
        self.outstanding += tokens
        self.requests += 1

    def end(self, tokens: int) -> None:
        self.inflight -= 1
        self.outstanding -= tokens

    def describe(self) -> dict[str, object]:
        return {
            "url": f"http://{self.name}",
            "healthy": self.healthy,
            "inflight": self.inflight,
            "outstanding_tokens": self.outstanding,
            "requests": self.requests,
            "errors": self.errors,
            "last_error": self.last_error,
        }


class BackendPool:
    """All backends of one role (`prefill` or `decode`)."""

    def __init__(self, role: str, backends: list[Backend]) -> None:
        self.role = role
        self.backends = backends
        self._next = 0

    def pick(self, exclude: tuple[Backend, ...] = ()) -> Backend | None:
        """The usable backend with the least outstanding tokens. The scan starts one place
        further on every call, so equal loads rotate instead of always landing on node 0."""
        backends = self.backends
        n = len(backends)
        start = self._next
        self._next = start + 1 if start + 1 < n else 0
        best: Backend | None = None
        for i in range(n):
            b = backends[(start + i) % n]
            if b.healthy is False or b in exclude:
                continue
            if best is None or b.outstanding < best.outstanding:
                best = b
        return best

    def any_healthy(self) -> bool:
        return any(b.healthy for b in self.backends)

    def mark_down(self, backend: Backend, reason: str) -> None:
        backend.errors += 1
        backend.last_error = reason
        if backend.healthy is not False:
            log.warning("%s %s marked down: %s", self.role, backend.name, reason)
        backend.healthy = False

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
            if backend.healthy is not True:
                if backend.healthy is False:
                    log.warning("%s %s is healthy again", pool.role, backend.name)
                backend.healthy = True
        else:
            pool.mark_down(backend, f"health check: HTTP {resp.status}")

    async def run_once(self) -> None:
        await asyncio.gather(*(self.check(p, b) for p in self.pools for b in p.backends))
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
            except Exception:  # noqa: BLE001 - a bug here must not stop future checks
                log.exception("health check round failed")
            await asyncio.sleep(self.interval)
