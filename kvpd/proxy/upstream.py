"""Keep-alive HTTP/1.1 client connections to one backend, driven by callback sinks (no per-chunk
coroutines): the response head and every read are handed to the sink as they arrive."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Protocol

from kvpd.proxy.http1 import MAX_HEAD_BYTES, ChunkedReader, HttpParseError, parse_response_head

if TYPE_CHECKING:
    from kvpd.proxy.hostpool import HostPool


class UpstreamError(Exception):
    """A backend could not be reached or did not answer properly."""

    kind = "error"

    def __init__(self, message: str, *, bytes_received: int = 0) -> None:
        super().__init__(message)
        self.bytes_received = bytes_received


class ConnectFailed(UpstreamError):
    kind = "connect"


class ReadTimeout(UpstreamError):
    kind = "timeout"


class ConnectionLost(UpstreamError):
    kind = "reset"

    def __init__(self, message: str, *, bytes_received: int = 0, reused: bool = False) -> None:
        super().__init__(message, bytes_received=bytes_received)
        # A reused keep-alive connection that dies before any byte came back was most likely
        # closed by the server while idle: the request never ran and may be resent.
        self.stale = reused and bytes_received == 0


class BadResponse(UpstreamError):
    kind = "protocol"


class Sink(Protocol):
    def on_head(self, status: int, headers: dict[bytes, bytes]) -> None: ...

    def on_body(self, data: bytes) -> None: ...

    def on_done(self) -> None: ...

    def on_error(self, exc: UpstreamError) -> None: ...


_CL, _CHUNKED, _UNTIL_CLOSE, _NO_BODY = 0, 1, 2, 3


class UpstreamConnection(asyncio.Protocol):
    """One TCP connection to a backend, carrying one request at a time."""

    def __init__(self, pool: HostPool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reused = False
        self.idle_since = 0.0
        self.sink: Sink | None = None
        self._head = b""
        self._in_body = False
        self._mode = _CL
        self._left = 0
        self._chunked: ChunkedReader | None = None
        self._keep_alive = True
        self._received = 0
        self._ticks = 0
        self._seen_ticks = -1
        self._timer: asyncio.TimerHandle | None = None
        self._timeout = 0.0
        self._then_timeout: float | None = None  # the silence limit once the body has begun
        self._first_limit = 0.0  # the wait for the first body byte, from the send (0: none)
        self._sent_at = 0.0
        self._head_partial = False  # part of a head came: its rest may not stall either
        self._head_request = False
        self._paused = False

    # --- asyncio callbacks -------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._cancel_timer()
        sink = self.sink
        if sink is None:
            return
        self.sink = None
        if self._in_body and self._mode == _UNTIL_CLOSE:
            sink.on_done()
            return
        reason = f": {exc}" if exc else ""
        sink.on_error(
            ConnectionLost(
                f"{self.pool.name} closed the connection mid-response{reason}"
                if self._received
                else f"{self.pool.name} closed the connection before answering{reason}",
                bytes_received=self._received,
                reused=self.reused,
            )
        )

    def pause_writing(self) -> None:  # request bodies are small; nothing to throttle
        pass

    def resume_writing(self) -> None:
        pass

    def data_received(self, data: bytes) -> None:
        """One read from the backend. In the body, the loop's work stays inline (one read, no
        call beyond the sink's); the head's reads and each body's end go to helpers (once per
        response)."""
        sink = self.sink
        if sink is None:
            # Bytes nobody asked for: the connection is out of sync; never reuse it.
            self.abort()
            return
        self._received += len(data)
        self._ticks += 1
        if not self._in_body:
            data = self._head_received(sink, data)
            if not data:
                return
        if self._then_timeout is not None:
            self._first_body_byte()
        mode = self._mode
        if mode == _CHUNKED:
            try:
                used = self._chunked.feed(data)  # type: ignore[union-attr]
            except HttpParseError as e:
                self._fail(BadResponse(f"{self.pool.name}: {e}"))
                return
            sink.on_body(data if used == len(data) else data[:used])
            if self._chunked.done:  # type: ignore[union-attr]
                self._body_ended(trailing=used != len(data))
        elif mode == _CL:
            left = self._left
            if len(data) >= left:
                sink.on_body(data if len(data) == left else data[:left])
                self._left = 0
                self._body_ended(trailing=len(data) > left)
            else:
                self._left = left - len(data)
                sink.on_body(data)
        else:
            sink.on_body(data)

    def _head_received(self, sink: Sink, data: bytes) -> bytes:
        """A read before the body: the head kept until complete, then parsed and handed to the
        sink. The body bytes that came with it (b"": nothing more to do with this read)."""
        head = self._head + data if self._head else data
        end = head.find(b"\r\n\r\n")
        if end < 0:
            self._head_incomplete(head)
            return b""
        self._head = b""
        try:
            status, headers = parse_response_head(head[:end])
        except HttpParseError as e:
            self._fail(BadResponse(f"{self.pool.name} sent a bad response: {e}"))
            return b""
        if status < 200:  # 100 Continue and friends: skip and wait for the real head
            rest = head[end + 4 :]
            if rest:
                self.data_received(rest)
            return b""
        self._start_body(status, headers)
        sink.on_head(status, headers)
        data = head[end + 4 :]
        if self.sink is None:  # the sink gave up inside on_head
            return b""
        if self._mode == _NO_BODY:
            self._finish()
            return b""
        if not data and self._head_partial:  # the head is complete: back to the first-byte wait
            self._head_partial = False
            left = self._first_limit - (self.pool.loop.time() - self._sent_at)
            self._rearm(max(left, 1e-3) if self._first_limit > 0 else 0.0)
        return data

    def _head_incomplete(self, head: bytes) -> None:
        """Part of a head: kept (bounded); a head that crawls falls under the silence limit."""
        if len(head) > MAX_HEAD_BYTES:
            self._fail(BadResponse(f"{self.pool.name} sent an oversized response head"))
            return
        self._head = head
        if self._then_timeout is not None and not self._head_partial:
            self._head_partial = True
            self._rearm(self._then_timeout)

    def _body_ended(self, trailing: bool) -> None:
        """The response's body is complete; bytes after it (`trailing`: pipelined garbage)
        mean the connection is not reused."""
        if trailing:
            self._keep_alive = False
        self._finish()

    # --- request side ------------------------------------------------------------------------
    def send(
        self,
        request: bytes,
        sink: Sink,
        timeout: float,
        head_request: bool = False,
        first_timeout: float | None = None,
    ) -> None:
        """Write a complete request; the response goes to `sink`. `timeout` is the longest
        silence allowed (the check runs every `timeout` seconds, so the effective limit is
        between one and two periods; this avoids re-arming a timer on every read); 0 is no
        limit. `first_timeout`, if given, bounds the wait for the first body byte instead (a
        deadline from the send; 0: no limit; a response head alone does not end it), and
        `timeout` applies from the first body byte on."""
        self.sink = sink
        self._in_body = False
        self._head = b""
        self._received = 0
        self._keep_alive = True
        self._head_request = head_request
        self._timeout = timeout if first_timeout is None else first_timeout
        self._then_timeout = None if first_timeout is None else timeout
        self._first_limit = first_timeout or 0.0
        self._sent_at = self.pool.loop.time()
        self._head_partial = False
        self._seen_ticks = -1
        if self._timeout > 0:
            self._timer = self.pool.loop.call_later(self._timeout, self._tick)
        self.transport.write(request)  # type: ignore[union-attr]

    def _start_body(self, status: int, headers: dict[bytes, bytes]) -> None:
        self._in_body = True
        conn = headers.get(b"connection")
        if conn is not None and conn.lower() == b"close":
            self._keep_alive = False
        if self._head_request or status in (204, 304):
            self._mode = _NO_BODY
            return
        te = headers.get(b"transfer-encoding")
        if te is not None and b"chunked" in te.lower():
            self._mode = _CHUNKED
            self._chunked = ChunkedReader()
            return
        cl = headers.get(b"content-length")
        if cl is not None:
            try:
                self._left = int(cl)
            except ValueError:
                self._left = -1
            if self._left < 0:
                self._mode = _UNTIL_CLOSE
                self._keep_alive = False
                return
            self._mode = _CL if self._left else _NO_BODY
            return
        self._mode = _UNTIL_CLOSE
        self._keep_alive = False

    def _first_body_byte(self) -> None:
        """From the first body byte on, the limit is the silence between chunks. vLLM sends a
        stream's head at once, so the head does not end the first-byte wait: in the layerwise
        flow the first chunk waits for the whole remote prefill and its queue."""
        self._head_partial = False
        self._rearm(self._then_timeout or 0.0)
        self._then_timeout = None

    def _rearm(self, timeout: float) -> None:
        self._cancel_timer()
        self._timeout = timeout
        self._seen_ticks = self._ticks
        if timeout > 0:
            self._timer = self.pool.loop.call_later(timeout, self._tick)

    def _tick(self) -> None:
        self._timer = None
        if self.sink is None:
            return
        if self._then_timeout is not None and not self._head_partial:  # the first-byte deadline
            what = "sent nothing" if not self._received else "sent no response body"
            self._fail(
                ReadTimeout(
                    f"{self.pool.name} {what} for {self._first_limit:g} s",
                    bytes_received=self._received,
                )
            )
            return
        if self._ticks != self._seen_ticks or self._paused:
            # progress, or no reads because the client is slow (its own timeout covers that)
            self._seen_ticks = self._ticks
            self._timer = self.pool.loop.call_later(self._timeout, self._tick)
            return
        self._fail(
            ReadTimeout(
                f"{self.pool.name} sent nothing for {self._timeout:g} s",
                bytes_received=self._received,
            )
        )

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _finish(self) -> None:
        sink = self.sink
        self.sink = None
        self._cancel_timer()
        if self._paused and not self.closed:
            # Paused for a slow client after the last bytes had already arrived: the next
            # user of this pooled connection must be able to read.
            self._paused = False
            self.transport.resume_reading()  # type: ignore[union-attr]
        if self._keep_alive:
            self.pool.release(self)
        else:
            self.abort()
        if sink is not None:
            sink.on_done()

    def _fail(self, exc: UpstreamError) -> None:
        sink = self.sink
        self.sink = None
        self.abort()
        if sink is not None:
            sink.on_error(exc)

    def detach(self) -> None:
        """The caller lost interest (its client went away): drop the response and the socket,
        which also makes vLLM abort the request."""
        self.sink = None
        self.abort()

    def at_chunk_boundary(self) -> bool:
        """The body bytes received so far end between chunks (a chunk can be appended)."""
        reader = self._chunked
        return self._mode == _CHUNKED and reader is not None and reader.between_chunks()

    def pause_reading(self) -> None:
        if self.transport is not None and not self.closed and not self._paused:
            self._paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None and not self.closed and self._paused:
            self._paused = False
            self.transport.resume_reading()

    def abort(self) -> None:
        self._cancel_timer()
        self.closed = True
        if self.transport is not None:
            self.transport.abort()
