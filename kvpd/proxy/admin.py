"""The admin interface: drain a backend (no new requests; wait, bounded, for its in-flight
ones) and re-admit it, for rolling restarts; list backends with their addresses.

Who may call it: with a token configured (--admin-token-file or KVPD_PROXY_ADMIN_TOKEN), only
requests carrying `Authorization: Bearer <token>`; without one, only clients connecting from
loopback on the proxy's host. Nothing else the proxy serves shows backend addresses."""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
from typing import TYPE_CHECKING, Any

from kvpd.proxy.relay import error_body

if TYPE_CHECKING:
    from kvpd.proxy.backends import Backend, BackendPool
    from kvpd.proxy.routing import AsyncHandler, Request
    from kvpd.proxy.server import ClientConnection


def is_loopback(peer: object) -> bool:
    """`peer` is a socket's peername; IPv4-mapped IPv6 loopback counts."""
    if not isinstance(peer, tuple) or not peer:
        return False
    try:
        ip = ipaddress.ip_address(str(peer[0]).split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


class Admin:
    def __init__(
        self,
        pools: list[BackendPool],
        token: str,
        drain_timeout: float,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.pools = pools
        self._expected = f"Bearer {token}".encode() if token else b""
        self.drain_timeout = drain_timeout
        self.loop = loop
        self.refused = 0
        self.routes: tuple[tuple[str, str, AsyncHandler], ...] = (
            ("GET", "/admin/backends", self.backends),
            ("POST", "/admin/drain", self.drain),
            ("POST", "/admin/admit", self.admit),
        )

    def _allowed(self, client: ClientConnection, req: Request) -> bool:
        if self._expected:
            given = req.headers.get(b"authorization", b"")
            ok = hmac.compare_digest(given, self._expected)
        else:
            transport = client.transport
            ok = transport is not None and is_loopback(transport.get_extra_info("peername"))
        if not ok:
            self.refused += 1
            why = (
                "the admin interface needs the proxy's admin token"
                if self._expected
                else "the admin interface answers only loopback clients on the proxy's host"
            )
            client.send_json(403, error_body(why, "forbidden", 403))
        return ok

    def _target(
        self, client: ClientConnection, req: Request
    ) -> tuple[Backend, BackendPool, dict[str, Any]] | None:
        try:
            payload = json.loads(req.body or b"{}")
            name = str(payload["backend"])
        except (ValueError, KeyError, TypeError):
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
        except (TypeError, ValueError):
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
