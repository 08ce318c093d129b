"""Pooled keep-alive connections to one backend, and buffered requests over them (health
checks, prefills, /v1/models)."""

from __future__ import annotations

import asyncio
import collections
import os

from kvpd.proxy.http1 import ChunkedReader
from kvpd.proxy.upstream import ConnectFailed, ConnectionLost, UpstreamConnection, UpstreamError

# uvicorn (vLLM's server) closes idle keep-alive connections after 5 s; drop ours a bit earlier
# so a request is never written into a socket the server is closing.
IDLE_TTL_S = 4.0
MAX_IDLE_PER_BACKEND = 512


class HostPool:
    """Idle keep-alive connections to one host:port, most recently used first."""

    def __init__(
        self,
        host: str,
        port: int,
        loop: asyncio.AbstractEventLoop,
        connect_timeout: float,
        name: str = "",
    ) -> None:
        self.host = host
        self.port = port
        self.address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        # What messages and metrics call it: the public name (e.g. decode-0), so answers to
        # clients never reveal backend addresses; logs map names to addresses at start.
        self.name = name or self.address
        self.loop = loop
        self.connect_timeout = connect_timeout
        self._idle: collections.deque[UpstreamConnection] = collections.deque()
        self.host_header = f"Host: {self.address}\r\n".encode()

    async def acquire(self) -> UpstreamConnection:
        idle = self._idle
        if idle:
            now = self.loop.time()
            while idle:
                conn = idle.pop()
                if not conn.closed and now - conn.idle_since < IDLE_TTL_S:
                    conn.reused = True
                    return conn
                conn.abort()
        return await self.connect()

    async def connect(self) -> UpstreamConnection:
        try:
            _, conn = await asyncio.wait_for(
                self.loop.create_connection(lambda: UpstreamConnection(self), self.host, self.port),
                self.connect_timeout,
            )
        except asyncio.TimeoutError:
            raise ConnectFailed(
                f"connecting to {self.name} timed out after {self.connect_timeout:g} s"
            ) from None
        except OSError as e:
            # only the errno's text: asyncio's message repeats the address
            reason = os.strerror(e.errno) if e.errno else type(e).__name__
            raise ConnectFailed(f"cannot connect to {self.name}: {reason}") from None
        conn.reused = False
        return conn

    def release(self, conn: UpstreamConnection) -> None:
        if conn.closed:
            return
        if len(self._idle) >= MAX_IDLE_PER_BACKEND:
            conn.abort()
            return
        conn.idle_since = self.loop.time()
        self._idle.append(conn)

    def prune(self) -> None:
        """Close idle connections past their time (otherwise only noticed on reuse), so that
        a burst's connections do not hold file descriptors for ever."""
        idle = self._idle
        now = self.loop.time()
        while idle and (idle[0].closed or now - idle[0].idle_since >= IDLE_TTL_S):
            idle.popleft().abort()

    def close(self) -> None:
        while self._idle:
            self._idle.pop().abort()


class BufferedResponse:
    """A sink that keeps the whole (de-chunked) response and resolves a future with it."""

    __slots__ = ("future", "status", "headers", "_parts")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.future: asyncio.Future[BufferedResponse] = loop.create_future()
        self.status = 0
        self.headers: dict[bytes, bytes] = {}
        self._parts: list[bytes] = []

    def on_head(self, status: int, headers: dict[bytes, bytes]) -> None:
        self.status = status
        self.headers = headers

    def on_body(self, data: bytes) -> None:
        self._parts.append(data)

    def on_done(self) -> None:
        if not self.future.done():
            self.future.set_result(self)

    def on_error(self, exc: UpstreamError) -> None:
        if not self.future.done():
            self.future.set_exception(exc)

    @property
    def body(self) -> bytes:
        raw = b"".join(self._parts)
        te = self.headers.get(b"transfer-encoding")
        if te is not None and b"chunked" in te.lower():
            reader = ChunkedReader(collect=True)
            reader.feed(raw)
            return reader.body()
        return raw


def build_request(
    method: bytes, path: bytes, pool: HostPool, body: bytes, extra_headers: bytes = b""
) -> bytes:
    """One request with Content-Length; `extra_headers` is pre-formatted header lines."""
    if method == b"GET" and not body:
        return b"".join(
            (method, b" ", path, b" HTTP/1.1\r\n", pool.host_header, extra_headers, b"\r\n")
        )
    return b"".join(
        (
            method,
            b" ",
            path,
            b" HTTP/1.1\r\n",
            pool.host_header,
            b"Content-Type: application/json\r\nContent-Length: ",
            str(len(body)).encode(),
            b"\r\n",
            extra_headers,
            b"\r\n",
            body,
        )
    )


async def fetch(
    pool: HostPool,
    method: bytes,
    path: bytes,
    body: bytes,
    timeout: float,
    extra_headers: bytes = b"",
) -> BufferedResponse:
    """Send one request and buffer the whole response; a stale keep-alive socket is retried
    once on a fresh connection."""
    request = build_request(method, path, pool, body, extra_headers)
    for attempt in range(2):
        conn = await (pool.acquire() if attempt == 0 else pool.connect())
        sink = BufferedResponse(pool.loop)
        conn.send(request, sink, timeout)
        try:
            return await sink.future
        except ConnectionLost as e:
            if not e.stale or attempt:
                raise
        except asyncio.CancelledError:
            conn.detach()
            raise
    raise AssertionError("unreachable")
