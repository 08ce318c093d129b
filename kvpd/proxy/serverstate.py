"""What the proxy's client connections share: routes, the client gate, limits (timeouts,
connections in all and per peer, buffered body bytes), open connections and running handlers;
and the sweeper that bounds slow, idle and non-reading clients."""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, NamedTuple

from kvpd.proxy.relay import error_body

if TYPE_CHECKING:
    from kvpd.proxy.routing import Request, Router
    from kvpd.proxy.server import ClientConnection

log = logging.getLogger("kvpd.proxy")
# On shutdown, how long a connection accepted without a byte yet may take to send its request.
FIRST_REQUEST_S = 1.0


class Limits(NamedTuple):
    """Client stall and keep-alive idle timeouts (s); the most connections served at once, in
    all and from one IP address; the largest body and all bodies buffered together (bytes).
    0 = unbounded."""

    client_timeout: float = 30.0
    idle_timeout: float = 300.0
    max_connections: int = 0
    max_per_peer: int = 0
    max_body: int = 0
    max_buffered: int = 0


class ClientGate:
    """Who may call what: with a client key, every path but the open ones needs
    `Authorization: Bearer <key>` (compared in constant time); paths in `own_auth` (the admin
    interface, the metaserver) check their own credential instead. Without a key: everyone."""

    def __init__(
        self, key: str, open_paths: frozenset[bytes], own_auth: frozenset[bytes] = frozenset()
    ) -> None:
        self._expected = f"Bearer {key}".encode() if key else b""
        self.free = open_paths | own_auth
        self.refused = 0
        self.refusal = error_body(
            "missing or wrong API key: send the proxy's client key as "
            "`Authorization: Bearer <key>`",
            "authentication_error",
            401,
        )

    @property
    def enabled(self) -> bool:
        return bool(self._expected)

    def allows(self, req: Request) -> bool:
        if not self._expected or req.path in self.free:
            return True
        given = req.headers.get(b"authorization", b"")
        if hmac.compare_digest(given, self._expected):
            return True
        self.refused += 1
        return False


class ServerState:
    """What connections share: routes, the loop, limits, open connections, running handlers."""

    def __init__(
        self,
        router: Router,
        loop: asyncio.AbstractEventLoop,
        access_log: bool = False,
        limits: Limits | None = None,
        gate: ClientGate | None = None,
    ) -> None:
        self.router = router
        self.loop = loop
        self.access_log = access_log
        self.limits = limits or Limits()
        self.gate = gate
        self.connections: set[ClientConnection] = set()
        self.per_peer: dict[str, int] = {}  # open connections by client IP address
        self.buffered = 0  # request body bytes held by all connections
        self.tasks: set[asyncio.Task[Any]] = set()
        self.refused = 0  # connections answered 503 because of max_connections / per peer
        self.timed_out = 0  # connections closed by the sweeper
        self.closing = False  # shutting down: each connection closes after its response

    def admit(self, peer: str) -> str:
        """Why a new connection from `peer` is refused ("" = it is admitted and counted)."""
        lim = self.limits
        if lim.max_connections and len(self.connections) >= lim.max_connections:
            return "too many connections"
        held = self.per_peer.get(peer, 0)
        if lim.max_per_peer and held >= lim.max_per_peer:
            return "too many connections from this address"
        self.per_peer[peer] = held + 1
        return ""

    def release_peer(self, peer: str) -> None:
        left = self.per_peer.get(peer, 0) - 1
        if left > 0:
            self.per_peer[peer] = left
        else:
            self.per_peer.pop(peer, None)

    def serving(self, now: float) -> bool:
        """Shutting down: a request still runs or arrives on a connection accepted before."""
        return bool(self.tasks) or any(c.serving(now) for c in self.connections)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """A task the server waits for on shutdown (and cancels after the grace period)."""
        task = self.loop.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def sweep(self) -> None:
        """Close clients that stall: a first request not begun, or a head or body not
        complete, within client_timeout (slow loris); a response not read for client_timeout
        (its stream is cut so the backend is freed); keep-alive connections idle for
        idle_timeout."""
        lim = self.limits
        period = max(0.01, min(1.0, lim.client_timeout / 4, lim.idle_timeout / 4))
        while True:
            await asyncio.sleep(period)
            now = self.loop.time()
            for conn in list(self.connections):
                try:
                    verdict = conn.stalled(now, lim)
                    if verdict:
                        self.timed_out += 1
                        conn.time_out(verdict)
                except Exception:  # one bad connection must not stop the sweeps
                    log.exception("sweeping a client connection failed")
                    conn.abort()
