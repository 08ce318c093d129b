"""Relaying a decoder's response to the client byte for byte, and the errors a request can end
with."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

from kvpd.proxy.http1 import ChunkedReader, encode_chunk, status_line

if TYPE_CHECKING:
    from kvpd.proxy.server import ClientConnection
    from kvpd.proxy.upstream import UpstreamConnection, UpstreamError
    from kvpd.proxy.usage import CachedTokens


def error_body(message: str, kind: str, code: int, **extra: Any) -> bytes:
    """vLLM's error object: message, type, param (the field at fault, or null), code."""
    err = {"message": message, "type": kind, "param": extra.pop("param", None), "code": code,
           **extra}  # fmt: skip
    return json.dumps({"error": err}).encode()


class Failure(Exception):
    """A request that cannot be served; becomes a JSON error response."""

    def __init__(self, status: int, kind: str, message: str, body: bytes = b"") -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.body = body or error_body(message, kind, status)


class DecodeRelay:
    """Sink that relays a decoder's response to the client byte for byte.

    The response head is held back until the first body bytes (so it goes out in the same
    write, and in the layerwise flow nothing reaches the client before the prefill has
    worked). A 5xx head switches to buffering so the caller can retry elsewhere.
    """

    __slots__ = (
        "client",
        "upstream",
        "future",
        "request_id",
        "status",
        "sent",
        "error_parts",
        "_head",
        "_rechunk",
        "_chunked",
        "_sse",
        "_dechunk",
        "usage",
        "first_byte_at",
        "loop",
    )

    def __init__(self, client: ClientConnection, request_id: bytes, loop: Any) -> None:
        self.client = client
        self.upstream: UpstreamConnection | None = None
        self.loop = loop
        self.future: asyncio.Future[Exception | None] = loop.create_future()
        self.request_id = request_id
        self.status = 0
        self.sent = False
        self.error_parts: list[bytes] | None = None
        self._head: bytes | None = None
        self._rechunk = False
        self._chunked = False  # the client's response is chunked (an event can be appended)
        self._sse = False
        self._dechunk: ChunkedReader | None = None  # an HTTP/1.0 client gets the payload only
        self.usage: CachedTokens | None = None  # rewrites cached-token figures (P/D)
        self.first_byte_at = 0.0

    def on_head(self, status: int, headers: dict[bytes, bytes]) -> None:
        self.status = status
        if status >= 500:
            self.error_parts = []
            return
        client = self.client
        ctype = headers.get(b"content-type", b"application/json")
        self._sse = ctype.startswith(b"text/event-stream")
        te = headers.get(b"transfer-encoding")
        chunked = te is not None and b"chunked" in te.lower()
        if not chunked and b"content-length" in headers:
            framing = b"content-length: " + headers[b"content-length"] + b"\r\n"
            if client.http10 and client.keep_alive:
                framing += b"connection: keep-alive\r\n"
        elif client.http10:
            # HTTP/1.0 has no chunked framing: the payload alone, ended by closing
            client.close_after_response()
            framing = b""
            if chunked:
                self._dechunk = ChunkedReader(collect=True)
        elif chunked:
            self._chunked = True
            framing = b"transfer-encoding: chunked\r\n"
        else:  # close-delimited upstream body: re-frame it for a keep-alive client
            self._rechunk = self._chunked = True
            framing = b"transfer-encoding: chunked\r\n"
        self._head = b"".join(
            (
                status_line(status),
                b"content-type: ",
                ctype,
                b"\r\n",
                framing,
                b"x-request-id: ",
                self.request_id,
                b"\r\n",
                b"\r\n" if client.keep_alive else b"connection: close\r\n\r\n",
            )
        )

    def on_body(self, data: bytes) -> None:
        if self.error_parts is not None:
            self.error_parts.append(data)
            return
        client = self.client
        if client.closed:
            return
        usage = self.usage
        if usage is not None and b"cache" in data:  # most chunks: no call
            data = usage.patch(data)
        if self._rechunk:
            data = encode_chunk(data)
        elif self._dechunk is not None:
            self._dechunk.feed(data)
            parts = self._dechunk.parts
            assert parts is not None
            data = b"".join(parts)
            parts.clear()
        head = self._head
        if head is not None:
            self._head = None
            data = head + data
            self.sent = True
            client.begin_response()
            self.first_byte_at = self.loop.time()
        client.transport.write(data)  # type: ignore[union-attr]

    def on_done(self) -> None:
        if self.error_parts is not None:
            result: Exception | None = BackendServerError()
        else:
            result = None
            if not self.client.closed:
                if self._head is not None:  # empty body: the head still has to go out
                    self.on_body(b"")
                if self._rechunk:
                    self.client.transport.write(b"0\r\n\r\n")  # type: ignore[union-attr]
        if not self.future.done():
            self.future.set_result(result)

    def on_error(self, exc: UpstreamError) -> None:
        if not self.future.done():
            self.future.set_result(exc)

    def break_stream(self, message: str) -> None:
        """The started response cannot be completed. An SSE client gets an error event it can
        show (when the bytes relayed so far end on a chunk boundary), then the connection
        closes without the final chunk: a broken body, never a clean `[DONE]`."""
        last = b""
        upstream = self.upstream
        at_boundary = self._rechunk or (upstream is not None and upstream.at_chunk_boundary())
        if self._sse and self._chunked and at_boundary:
            event = b"data: " + error_body(message, "stream_broken", 502) + b"\n\n"
            last = encode_chunk(event)
        if last:
            self.client.end_stream(last)
        else:
            self.client.abort()

    def abandon(self, reason: Exception) -> None:
        """Stop relaying (client gone, or the prefill behind this decode failed)."""
        if self.upstream is not None:
            self.upstream.detach()
        if not self.future.done():
            self.future.set_result(reason)


class ClientGone(Exception):
    """The client closed its connection before the answer was complete."""


class BackendServerError(Exception):
    """The decoder answered 5xx before anything was relayed (its body is in error_parts)."""
