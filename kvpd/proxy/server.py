"""The proxy's inbound HTTP/1.1 side: an asyncio Protocol per client connection that parses
requests (keep-alive, pipelining, Expect: 100-continue, chunked bodies) and hands them to
the app's routes."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from kvpd.proxy.http1 import (
    MAX_HEAD_BYTES,
    ChunkedReader,
    HttpParseError,
    build_response,
    parse_headers,
)

if TYPE_CHECKING:
    from kvpd.proxy.upstream import UpstreamConnection

log = logging.getLogger("kvpd.proxy")

MAX_BODY_BYTES = 64 * 1024 * 1024


class Request:
    __slots__ = ("method", "path", "query", "headers", "body", "keep_alive", "started")

    def __init__(
        self,
        method: bytes,
        path: bytes,
        query: bytes,
        headers: dict[bytes, bytes],
        keep_alive: bool,
        started: float,
    ) -> None:
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers
        self.body = b""
        self.keep_alive = keep_alive
        self.started = started


SyncHandler = Callable[["ClientConnection", Request], None]
AsyncHandler = Callable[["ClientConnection", Request], Awaitable[None]]


class Router:
    def __init__(self) -> None:
        self.sync: dict[tuple[bytes, bytes], SyncHandler] = {}
        self.async_: dict[tuple[bytes, bytes], AsyncHandler] = {}
        self.paths: set[bytes] = set()

    def add(self, method: str, path: str, handler: SyncHandler) -> None:
        self.sync[(method.encode(), path.encode())] = handler
        self.paths.add(path.encode())

    def add_async(self, method: str, path: str, handler: AsyncHandler) -> None:
        self.async_[(method.encode(), path.encode())] = handler
        self.paths.add(path.encode())


class ServerState:
    """What connections share: routes, the loop, open connections and running handlers."""

    def __init__(self, router: Router, loop: asyncio.AbstractEventLoop, access_log: bool) -> None:
        self.router = router
        self.loop = loop
        self.access_log = access_log
        self.connections: set[ClientConnection] = set()
        self.tasks: set[asyncio.Task[None]] = set()


class ClientConnection(asyncio.Protocol):
    """One client connection; requests on it are served one at a time, in order."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.busy = False
        self.response_started = False
        self.keep_alive = True
        # While a decoder stream is relayed here: that upstream connection (for backpressure)
        # and a callback for a client that goes away mid-request.
        self.relay: UpstreamConnection | None = None
        self.on_lost: Callable[[], None] | None = None
        self._buf = b""
        self._req: Request | None = None  # head parsed, body incomplete
        self._need = 0
        self._chunked: ChunkedReader | None = None
        self._parts: list[bytes] = []
        self._got = 0

    # --- asyncio callbacks -------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.state.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.state.connections.discard(self)
        cb = self.on_lost
        if cb is not None:
            self.on_lost = None
            cb()

    def pause_writing(self) -> None:
        if self.relay is not None:
            self.relay.pause_reading()

    def resume_writing(self) -> None:
        if self.relay is not None:
            self.relay.resume_reading()

    def data_received(self, data: bytes) -> None:
        if self._req is not None:
            self._body_data(data)
            return
        self._buf = self._buf + data if self._buf else data
        if not self.busy:
            self._parse()

    # --- parsing -----------------------------------------------------------------------------
    def _parse(self) -> None:
        buf = self._buf
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            if len(buf) > MAX_HEAD_BYTES:
                self._reject(431, "request head too large")
            return
        try:
            lines = buf[:end].split(b"\r\n")
            method, target, version = lines[0].split(b" ")
            headers = parse_headers(lines[1:])
        except (ValueError, HttpParseError):
            self._reject(400, "malformed HTTP request")
            return
        conn = headers.get(b"connection", b"").lower()
        keep_alive = conn != b"close" if version == b"HTTP/1.1" else conn == b"keep-alive"
        path, _, query = target.partition(b"?")
        req = Request(method, path, query, headers, keep_alive, self.state.loop.time())
        rest = buf[end + 4 :]
        self._buf = b""
        te = headers.get(b"transfer-encoding")
        if te is not None:
            if te.lower() != b"chunked":
                self._reject(501, "only chunked transfer-encoding is supported")
                return
            self._chunked = ChunkedReader(collect=True)
            self._need = -1
        else:
            try:
                self._need = int(headers.get(b"content-length", b"0"))
            except ValueError:
                self._need = -2
            if self._need < 0 or self._need > MAX_BODY_BYTES:
                self._reject(400 if self._need < 0 else 413, "bad or too large content-length")
                return
            if self._need == 0:
                self._dispatch(req, rest)
                return
        self._req = req
        self._parts = []
        self._got = 0
        if headers.get(b"expect", b"").lower() == b"100-continue" and len(rest) == 0:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # type: ignore[union-attr]
        if rest:
            self._body_data(rest)

    def _body_data(self, data: bytes) -> None:
        req = self._req
        assert req is not None
        chunked = self._chunked
        if chunked is not None:
            try:
                used = chunked.feed(data)
            except HttpParseError as e:
                self._reject(400, str(e))
                return
            if not chunked.done:
                return
            req.body = chunked.body()
            self._chunked = None
            self._req = None
            self._dispatch(req, data[used:])
            return
        need = self._need - self._got
        if len(data) < need:
            self._parts.append(data)
            self._got += len(data)
            return
        if self._parts:
            self._parts.append(data[:need])
            req.body = b"".join(self._parts)
            self._parts = []
        else:
            req.body = data if len(data) == need else data[:need]
        self._req = None
        self._dispatch(req, data[need:])

    def _dispatch(self, req: Request, rest: bytes) -> None:
        self._buf = rest
        self.busy = True
        self.response_started = False
        self.keep_alive = req.keep_alive
        router = self.state.router
        key = (req.method, req.path)
        handler = router.sync.get(key)
        if handler is not None:
            try:
                handler(self, req)
            except Exception:  # noqa: BLE001 - one bad request must not kill the server
                log.exception("handler for %s failed", req.path.decode(errors="replace"))
                if not self.response_started:
                    self.send_json(500, b'{"error":{"message":"internal proxy error"}}')
            return
        ahandler = router.async_.get(key)
        if ahandler is not None:
            task = self.state.loop.create_task(self._run(ahandler, req))
            self.state.tasks.add(task)
            task.add_done_callback(self.state.tasks.discard)
            return
        if req.path in router.paths:
            self.send_json(405, b'{"error":{"message":"method not allowed"}}')
        else:
            self.send_json(404, b'{"error":{"message":"not found"}}')

    async def _run(self, handler: AsyncHandler, req: Request) -> None:
        try:
            await handler(self, req)
        except asyncio.CancelledError:
            self.abort()
            raise
        except Exception:  # noqa: BLE001
            log.exception("handler for %s failed", req.path.decode(errors="replace"))
            if not self.response_started and not self.closed:
                self.send_json(500, b'{"error":{"message":"internal proxy error"}}')
            else:
                self.abort()
        if self.state.access_log:
            log.info(
                "%s %s %.1f ms",
                req.method.decode(),
                req.path.decode(errors="replace"),
                (self.state.loop.time() - req.started) * 1e3,
            )

    def _reject(self, status: int, message: str) -> None:
        self.keep_alive = False
        self._req = None
        self._buf = b""
        body = b'{"error":{"message":"%s"}}' % message.encode()
        if self.transport is not None and not self.closed:
            self.transport.write(build_response(status, body, close=True))
            self.transport.close()

    # --- responding --------------------------------------------------------------------------
    def send_json(self, status: int, body: bytes, extra: bytes = b"") -> None:
        self.send(status, body, b"application/json", extra)

    def send(self, status: int, body: bytes, content_type: bytes, extra: bytes = b"") -> None:
        """A complete response; ends the request."""
        if self.closed:
            self.busy = False
            return
        self.response_started = True
        self.transport.write(  # type: ignore[union-attr]
            build_response(status, body, content_type, extra, close=not self.keep_alive)
        )
        self.finish()

    def finish(self) -> None:
        """The current response is complete: close, or serve the next pipelined request."""
        self.busy = False
        self.relay = None
        self.on_lost = None
        if self.closed:
            return
        if not self.keep_alive:
            self.transport.close()  # type: ignore[union-attr]
            return
        if self._buf:
            # Next pipelined request: on a fresh stack, so a long pipeline cannot recurse.
            self.state.loop.call_soon(self._parse_next)

    def _parse_next(self) -> None:
        if not self.busy and not self.closed and self._req is None and self._buf:
            self._parse()

    def abort(self) -> None:
        """Drop the connection: the only honest signal once a 200 stream has broken."""
        self.busy = False
        self.relay = None
        self.on_lost = None
        if self.transport is not None and not self.closed:
            self.transport.abort()
