"""The proxy's inbound HTTP/1.1 side: an asyncio Protocol per client connection that parses
requests strictly (keep-alive, pipelining, Expect: 100-continue, chunked bodies) and hands them
to routes once the client gate (kvpd/proxy/serverstate.py) lets them through."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from http import HTTPStatus
from typing import TYPE_CHECKING

from kvpd.proxy.http1 import (
    MAX_BODY_BYTES,
    MAX_HEAD_BYTES,
    ChunkedReader,
    HttpParseError,
    build_response,
    find_head_end,
    parse_request_head,
)
from kvpd.proxy.phase import Phase, error, keeps_alive
from kvpd.proxy.routing import AsyncHandler, Request
from kvpd.proxy.serverstate import FIRST_REQUEST_S, ClientGate, Limits, ServerState
from kvpd.proxy.unrouted import is_preflight, unrouted

__all__ = ["ClientConnection", "ClientGate", "Limits", "Phase", "ServerState", "FIRST_REQUEST_S"]

if TYPE_CHECKING:
    from kvpd.proxy.upstream import UpstreamConnection

log = logging.getLogger("kvpd.proxy")
_BUSY = frozenset((Phase.HANDLING, Phase.RESPONDING))  # a request is being answered


class ClientConnection(asyncio.Protocol):
    """One client connection; requests on it are served one at a time, in order."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.transport: asyncio.Transport | None = None
        self.phase = Phase.FRESH
        self.closed = False  # the transport is gone (set only by connection_lost)
        self.keep_alive = True  # of the current request; see close_after_response
        self.http10 = False  # the current request is HTTP/1.0: no chunked framing for it
        # While a decoder stream is relayed here: that upstream connection (for backpressure)
        # and a callback for a client that goes away mid-request.
        self.relay: UpstreamConnection | None = None
        self.on_lost: Callable[[], None] | None = None
        self.task: asyncio.Task[None] | None = None
        self.since = state.loop.time()  # start of the current phase (idle, reading, paused)
        self.paused = False  # the transport's write buffer is full (flow control, any phase)
        self._held = False  # reading paused: pipelined requests wait for the current one
        self._buf = b""
        self._req: Request | None = None  # head parsed, body incomplete
        self._need = 0
        self._chunked: ChunkedReader | None = None
        self._parts: list[bytes] = []
        self._got = 0
        self._held_bytes = 0  # body bytes this connection counts in state.buffered
        self._peer = ""  # the client's address, counted in state.per_peer

    # --- the phase (read-only outside: moved by the methods below) ---------------------------
    busy = property(lambda self: self.phase in _BUSY)
    response_started = property(lambda self: self.phase is Phase.RESPONDING)

    def begin_response(self) -> None:
        """The current request's answer starts going out (no retry elsewhere from now on)."""
        if self.phase is Phase.HANDLING:
            self.phase = Phase.RESPONDING

    def relay_from(self, upstream: UpstreamConnection, on_lost: Callable[[], None]) -> None:
        """A decoder's stream is relayed here: its connection (paused when the client's is
        full) and what a client that goes away mid-request ends."""
        self.relay, self.on_lost = upstream, on_lost

    def close_after_response(self) -> None:
        """The current answer ends with the connection (an HTTP/1.0 body without length)."""
        self.keep_alive = False

    def _served(self) -> None:
        """No request runs any more (answered, broken or dropped)."""
        self.phase = Phase.IDLE
        self.relay = None
        self.on_lost = None
        self.task = None

    # --- asyncio callbacks -------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        state = self.state
        peername = transport.get_extra_info("peername")
        peer = str(peername[0]) if isinstance(peername, tuple) and peername else ""
        refusal = state.admit(peer)
        if refusal:
            state.refused += 1
            self.keep_alive = False
            transport.write(build_response(503, error(refusal, 503), close=True))  # type: ignore[attr-defined]
            transport.close()
            return
        self._peer = peer
        state.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        busy = self.busy
        self.closed = True
        if self in self.state.connections:
            self.state.connections.discard(self)
            self.state.release_peer(self._peer)
        self._release_body()
        cb = self.on_lost
        if cb is not None:
            self.on_lost = None
            cb()
        elif busy and self.task is not None and not self.task.done():
            # Gone before its response began streaming (e.g. during the prefill): cancel the
            # handler, which drops its backend connection so the engine frees the sequence.
            self.task.cancel()

    def pause_writing(self) -> None:
        self.paused = True
        self.since = self.state.loop.time()
        if self.relay is not None:
            self.relay.pause_reading()

    def resume_writing(self) -> None:
        self.paused = False
        if self.relay is not None:
            self.relay.resume_reading()

    def data_received(self, data: bytes) -> None:
        if self.phase is Phase.FRESH:
            self.phase = Phase.IDLE
        if self._req is not None:
            self._body_data(data)
            return
        if self._buf:
            self._buf += data
        else:
            self._buf = data
            if self.phase not in _BUSY:
                self.since = self.state.loop.time()  # a new request starts arriving
        if self.phase not in _BUSY:
            self._parse()
        elif len(self._buf) > MAX_HEAD_BYTES and not self._held:
            # Pipelined bytes beyond one head while a response runs: stop reading (TCP pushes
            # back on the client) instead of buffering without bound.
            self._held = True
            self.transport.pause_reading()  # type: ignore[union-attr]

    @property
    def midway(self) -> bool:  # a request runs or is partly received
        return self.busy or bool(self._buf) or self._req is not None

    def serving(self, now: float) -> bool:
        """Midway, or connected a moment ago with its request surely on the way (accepted)."""
        fresh = self.phase is Phase.FRESH and now - self.since < FIRST_REQUEST_S
        return not self.closed and (self.midway or fresh)

    def shut(self) -> None:
        """At the end of a shutdown: close an idle connection cleanly, cut one mid-request."""
        if self.midway:
            self.abort()
        elif self.transport is not None and not self.closed:
            self.transport.close()

    # --- timeouts ----------------------------------------------------------------------------
    def stalled(self, now: float, lim: Limits) -> str:
        """Why the sweeper should close this connection now ("" = keep it)."""
        if self.closed:
            return ""
        if self.busy:
            if self.paused and now - self.since > lim.client_timeout:
                return "client stopped reading the response"
            return ""
        if self.phase is Phase.FRESH:  # not a byte yet: the client timeout applies
            return "no request in time" if now - self.since > lim.client_timeout else ""
        if self._buf or self._req is not None:
            if now - self.since > lim.client_timeout:
                return "request not received in time"
            return ""
        if now - self.since > lim.idle_timeout:
            return "idle"
        return ""

    def time_out(self, why: str) -> None:
        if why == "request not received in time":
            self._reject(408, why)
        elif why in ("idle", "no request in time"):
            self.transport.close()  # type: ignore[union-attr]
        else:
            log.info("dropping a client: %s for %g s", why, self.state.limits.client_timeout)
            self.abort()  # runs on_lost: the stream's backend connection is dropped too

    # --- parsing -----------------------------------------------------------------------------
    def _parse(self) -> None:
        buf = self._buf
        try:
            end = find_head_end(buf)
            if end > MAX_HEAD_BYTES or (end < 0 and len(buf) > MAX_HEAD_BYTES):
                raise HttpParseError("request head too large", 431)
            if end < 0:
                return
            head = parse_request_head(buf[:end])
        except HttpParseError as e:
            self._reject(e.status, str(e))
            return
        headers = head.headers
        http10 = head.version == b"HTTP/1.0"
        keep_alive = keeps_alive(http10, headers.get(b"connection"))
        self.http10 = http10
        path, _, query = head.target.partition(b"?")
        req = Request(head.method, path, query, headers, keep_alive, self.state.loop.time())
        gate = self.state.gate
        if gate is not None and not is_preflight(req) and not gate.allows(req):
            # before its body: a client without the key gets no buffer, and the connection
            # closes (its body, if any, is never read)
            self._reject(401, "", gate.refusal, b"www-authenticate: Bearer\r\n")
            return
        rest = buf[end + 4 :]
        self._buf = b""
        if head.length == 0:
            self._dispatch(req, rest)
            return
        limit = self.state.limits.max_body or MAX_BODY_BYTES
        if head.length > limit:
            self._reject(413, f"body larger than {limit} bytes")
            return
        if head.length < 0:
            self._chunked = ChunkedReader(collect=True, limit=limit)
        self._need = head.length
        self._req = req
        self._parts = []
        self._got = 0
        continue_ = headers.get(b"expect", b"").lower() == b"100-continue"
        if continue_ and not http10 and len(rest) == 0:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # type: ignore[union-attr]
        if rest:
            self._body_data(rest)

    def _body_data(self, data: bytes) -> None:
        req = self._req
        assert req is not None
        state = self.state
        cap = state.limits.max_buffered
        if cap and state.buffered + len(data) > cap:
            self._reject(503, "the proxy is buffering too many request bodies; retry later")
            return
        state.buffered += len(data)
        self._held_bytes += len(data)
        chunked = self._chunked
        if chunked is not None:
            try:
                used = chunked.feed(data)
            except HttpParseError as e:
                self._reject(e.status, str(e))
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
        self.phase = Phase.HANDLING
        self.keep_alive = req.keep_alive
        router = self.state.router
        key = (req.method, req.path)
        handler = router.sync.get(key)
        if handler is not None:
            try:
                handler(self, req)
            except Exception:  # one bad request must not kill the server
                log.exception("handler for %s failed", req.path.decode(errors="replace"))
                if not self.response_started:
                    self.send_json(500, error("internal proxy error", 500))
            return
        ahandler = router.async_.get(key)
        if ahandler is not None:
            self.task = self.state.spawn(self._run(ahandler, req))
            return
        status, body, ctype, extra = unrouted(router, req)
        if body is None:
            body = error(HTTPStatus(status).phrase.lower(), status)
        self.send(status, body, ctype, extra)

    async def _run(self, handler: AsyncHandler, req: Request) -> None:
        try:
            await handler(self, req)
        except asyncio.CancelledError:
            self.abort()
            raise
        except Exception:
            log.exception("handler for %s failed", req.path.decode(errors="replace"))
            if not self.response_started and not self.closed:
                self.send_json(500, error("internal proxy error", 500))
            else:
                self.abort()
        if self.state.access_log:
            log.info(
                "%s %s %.1f ms",
                req.method.decode(),
                req.path.decode(errors="replace"),
                (self.state.loop.time() - req.started) * 1e3,
            )

    def _reject(self, status: int, message: str, body: bytes = b"", extra: bytes = b"") -> None:
        """Answer `status` and close, whatever else the client has sent or will send."""
        self.keep_alive = False
        self._req = None
        self._chunked = None
        self._buf = b""
        self._release_body()
        body = body or error(message, status)
        if self.transport is not None and not self.closed:
            self.transport.write(build_response(status, body, b"application/json", extra, True))
            self.transport.close()

    # --- responding --------------------------------------------------------------------------
    def send_json(self, status: int, body: bytes, extra: bytes = b"") -> None:
        self.send(status, body, b"application/json", extra)

    def send(self, status: int, body: bytes, content_type: bytes, extra: bytes = b"") -> None:
        """A complete response; ends the request."""
        if self.closed:
            self.phase = Phase.IDLE
            return
        self.begin_response()
        if self.http10 and self.keep_alive:
            extra += b"connection: keep-alive\r\n"
        self.transport.write(  # type: ignore[union-attr]
            build_response(status, body, content_type, extra, close=not self.keep_alive)
        )
        self.finish()

    def _release_body(self) -> None:
        if self._held_bytes:
            self.state.buffered -= self._held_bytes
            self._held_bytes = 0

    def finish(self) -> None:
        """The current response is complete: close, or serve the next pipelined request."""
        self._release_body()
        self._served()
        if self.closed:
            return
        self.since = self.state.loop.time()
        if not self.keep_alive or (self.state.closing and not self._buf):
            self.transport.close()  # type: ignore[union-attr]
            return
        if self._held:
            self._held = False
            self.transport.resume_reading()  # type: ignore[union-attr]
        if self._buf:
            # Next pipelined request: on a fresh stack, so a long pipeline cannot recurse.
            self.state.loop.call_soon(self._parse_next)

    def _parse_next(self) -> None:
        if not self.busy and not self.closed and self._req is None and self._buf:
            self._parse()

    def end_stream(self, last: bytes) -> None:
        """A started response cannot be completed: send `last` (an SSE error event, already
        framed) and close without the final chunk, so no client can take it as complete."""
        self._served()
        self.keep_alive = False
        if self.transport is not None and not self.closed:
            if self.paused:  # it would never be flushed to a client that does not read
                self.transport.abort()
                return
            if last:
                self.transport.write(last)
            self.transport.close()

    def abort(self) -> None:
        """Drop the connection: the only honest signal once a non-SSE response has broken.
        `on_lost` still runs (from connection_lost), so a relayed stream's backend connection
        is dropped too."""
        on_lost = self.on_lost
        self._served()
        self.on_lost = on_lost  # connection_lost still calls it
        if self.transport is not None and not self.closed:
            self.transport.abort()
