"""The admin interface: drain a backend (no new requests; wait, bounded, for its in-flight
ones) and re-admit it, for rolling restarts; list backends with their addresses; reset every
engine's prefix cache.

Who may call it: only requests carrying `Authorization: Bearer <token>` with the token
configured (--admin-token-file or KVPD_PROXY_ADMIN_TOKEN); without a token the interface is
off. Being on loopback is no credential (every local user and any page a local browser opens
is there). Requests with an Origin header (sent by browsers) or, with a body, a content type
other than application/json are refused, so a web page cannot drive it either. Nothing else
the proxy serves shows backend addresses."""

from __future__ import annotations

import asyncio
import hmac
import json
from typing import TYPE_CHECKING, Any

from kvpd.proxy.cache_aware import clear_indexes
from kvpd.proxy.hostpool import fetch
from kvpd.proxy.relay import Failure, error_body
from kvpd.proxy.rewrite import parse_body
from kvpd.proxy.upstream import UpstreamError

if TYPE_CHECKING:
    from kvpd.proxy.backends import Backend, BackendPool
    from kvpd.proxy.routing import AsyncHandler, Request
    from kvpd.proxy.server import ClientConnection


def _json_or_nothing(req: Request) -> bool:
    """No body and no content type, or a JSON one (a form or text/plain is what a web page
    can send without asking the browser)."""
    ctype = req.headers.get(b"content-type")
    if ctype is None:
        return not req.body
    return ctype.split(b";", 1)[0].strip().lower() == b"application/json"


class Admin:
    def __init__(
        self,
        pools: list[BackendPool],
        token: str,
        drain_timeout: float,
        loop: asyncio.AbstractEventLoop,
        backend_auth: bytes = b"",
    ) -> None:
        self.pools = pools
        self.backend_auth = backend_auth  # the Authorization line for the engines, if any
        self._expected = f"Bearer {token}".encode() if token else b""
        self.drain_timeout = drain_timeout
        self.loop = loop
        self.refused = 0
        self.routes: tuple[tuple[str, str, AsyncHandler], ...] = (
            ("GET", "/admin/backends", self.backends),
            ("POST", "/admin/drain", self.drain),
            ("POST", "/admin/admit", self.admit),
            ("POST", "/admin/reset_prefix_cache", self.reset_prefix_cache),
        )
        self.paths = frozenset(path.encode() for _, path, _ in self.routes)

    def _allowed(self, client: ClientConnection, req: Request) -> bool:
        why = ""
        if not self._expected:
            why = (
                "the admin interface is off: start the proxy with --admin-token-file or "
                "KVPD_PROXY_ADMIN_TOKEN"
            )
        elif not hmac.compare_digest(req.headers.get(b"authorization", b""), self._expected):
            why = "the admin interface needs the proxy's admin token"
        elif b"origin" in req.headers:
            why = "the admin interface refuses browser requests (an Origin header)"
        elif not _json_or_nothing(req):
            why = "the admin interface takes only application/json bodies"
        if why:
            self.refused += 1
            client.send_json(403, error_body(why, "forbidden", 403))
        return not why

    def _target(
        self, client: ClientConnection, req: Request
    ) -> tuple[Backend, BackendPool, dict[str, Any]] | None:
        try:
            payload = parse_body(req.body or b"{}")
            name = str(payload["backend"])
        except (Failure, KeyError):
            client.send_json(400, error_body(
                'expected a JSON body {"backend": "decode-0"}', "bad_request", 400))  # fmt: skip
            return None
        for pool in self.pools:
            backend = pool.find(name)
            if backend is not None:
                return backend, pool, payload
        names = ", ".join(b.name for p in self.pools for b in p.backends)
        client.send_json(404, error_body(f"no backend {name!r} (have {names})", "not_found", 404))
        return None

    @staticmethod
    def _state(backend: Backend, pool: BackendPool) -> dict[str, Any]:
        return {"backend": backend.name, "role": pool.role, "address": backend.pool.address,
                "healthy": backend.healthy, "circuit": backend.circuit,
                "draining": backend.draining, "inflight": backend.inflight}  # fmt: skip

    async def backends(self, client: ClientConnection, req: Request) -> None:
        if not self._allowed(client, req):
            return
        rows = [self._state(b, p) for p in self.pools for b in p.backends]
        client.send_json(200, json.dumps({"backends": rows}).encode())

    async def drain(self, client: ClientConnection, req: Request) -> None:
        """No new requests to the backend; answer once its in-flight requests are done or
        after `timeout` seconds (default --drain-timeout), saying which."""
        if not self._allowed(client, req):
            return
        found = self._target(client, req)
        if found is None:
            return
        backend, pool, payload = found
        try:
            timeout = float(payload.get("timeout", self.drain_timeout))
        except (TypeError, ValueError, OverflowError):  # e.g. a list, "x", 10**400
            timeout = -1.0
        if not 0 <= timeout <= 3600:
            client.send_json(400, error_body("timeout must be 0-3600 seconds", "bad_request", 400))
            return
        pool.set_draining(backend, True)
        deadline = self.loop.time() + timeout
        while backend.inflight > 0 and self.loop.time() < deadline and not client.closed:
            await asyncio.sleep(0.01)
        body = dict(self._state(backend, pool), drained=backend.inflight == 0)
        client.send_json(200, json.dumps(body).encode())

    async def admit(self, client: ClientConnection, req: Request) -> None:
        if not self._allowed(client, req):
            return
        found = self._target(client, req)
        if found is None:
            return
        backend, pool, _ = found
        pool.set_draining(backend, False)
        client.send_json(200, json.dumps(self._state(backend, pool)).encode())

    async def reset_prefix_cache(self, client: ClientConnection, req: Request) -> None:
        """POST /reset_prefix_cache to every engine (with the backend key, if any)."""
        if not self._allowed(client, req):
            return
        backends = [b for p in self.pools for b in p.backends]
        clear_indexes(*self.pools)  # the engines' caches are emptied: so is what routing knows

        async def one(b: Backend) -> str:
            try:
                r = await fetch(
                    b.pool, b"POST", b"/reset_prefix_cache", b"", 10.0, self.backend_auth
                )
            except UpstreamError as e:
                return str(e)
            return "" if r.status == 200 else f"{b.name} answered HTTP {r.status}"

        failed = [p for p in await asyncio.gather(*(one(b) for b in backends)) if p]
        if failed:
            client.send_json(500, error_body("; ".join(failed), "reset_failed", 500))
        else:
            client.send_json(200, b'{"status":"ok"}')
