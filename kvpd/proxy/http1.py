"""Minimal HTTP/1.1 framing shared by the proxy's server and client: heads and chunked bodies."""

from __future__ import annotations

from http import HTTPStatus

MAX_HEAD_BYTES = 64 * 1024
_REASONS = {s.value: s.phrase for s in HTTPStatus}


class HttpParseError(Exception):
    """The peer sent bytes that are not valid HTTP/1.1 framing."""


def parse_headers(lines: list[bytes]) -> dict[bytes, bytes]:
    """Header lines to a dict keyed by lower-case name (repeated names keep the last value,
    which is enough for the few headers the proxy reads)."""
    headers: dict[bytes, bytes] = {}
    for line in lines:
        name, sep, value = line.partition(b":")
        if not sep:
            raise HttpParseError(f"malformed header line {line[:60]!r}")
        headers[name.strip().lower()] = value.strip()
    return headers


def parse_response_head(head: bytes) -> tuple[int, dict[bytes, bytes]]:
    """`HTTP/1.1 200 OK\\r\\nName: value...` (without the blank line) to (status, headers)."""
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/"):
        raise HttpParseError(f"bad status line {lines[0][:80]!r}")
    try:
        status = int(parts[1])
    except ValueError:
        raise HttpParseError(f"bad status code in {lines[0][:80]!r}") from None
    headers = parse_headers(lines[1:])
    if parts[0] == b"HTTP/1.0" and headers.get(b"connection", b"").lower() != b"keep-alive":
        headers[b"connection"] = b"close"
    return status, headers


def status_line(status: int) -> bytes:
    return f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}\r\n".encode()


def build_response(
    status: int,
    body: bytes,
    content_type: bytes = b"application/json",
    extra: bytes = b"",
    close: bool = False,
) -> bytes:
    """A complete response with Content-Length; `extra` is pre-formatted header lines."""
    return b"".join(
        (
            status_line(status),
            b"content-type: ",
            content_type,
            b"\r\ncontent-length: ",
            str(len(body)).encode(),
            b"\r\n",
            extra,
            b"connection: close\r\n\r\n" if close else b"\r\n",
            body,
        )
    )


class ChunkedReader:
    """Follows `Transfer-Encoding: chunked` framing across reads.

    The relay forwards the raw bytes and only needs to know where the body ends; the buffering
    client also wants the payload, so `collect` keeps the de-framed parts.
    """

    __slots__ = ("_left", "_trailer", "_pending", "done", "parts")

    def __init__(self, collect: bool = False) -> None:
        self._left = 0  # bytes left in the current chunk, including its trailing CRLF
        self._trailer = False  # saw the last (zero-size) chunk; waiting for the final CRLF
        self._pending = b""  # an incomplete size line or trailer kept from the previous read
        self.done = False
        self.parts: list[bytes] | None = [] if collect else None

    def feed(self, data: bytes) -> int:
        """Consume `data`; return how many of its bytes belong to this body (less than
        len(data) only when the body ended inside it)."""
        if self.done:
            return 0
        carried = len(self._pending)
        if carried:
            data = self._pending + data
            self._pending = b""
        pos = 0
        n = len(data)
        parts = self.parts
        while pos < n:
            left = self._left
            if left:
                take = n - pos if n - pos < left else left
                if parts is not None and left > 2:
                    end = pos + min(take, left - 2)
                    if end > pos:
                        parts.append(data[pos:end])
                self._left = left - take
                pos += take
                continue
            if self._trailer:
                if n - pos < 2:
                    self._pending = data[pos:]
                    return n - carried
                if data[pos : pos + 2] == b"\r\n":
                    end = pos + 2
                else:
                    idx = data.find(b"\r\n\r\n", pos)
                    if idx < 0:
                        self._pending = data[pos:]
                        if len(self._pending) > MAX_HEAD_BYTES:
                            raise HttpParseError("chunked trailer too long")
                        return n - carried
                    end = idx + 4
                self.done = True
                return max(0, end - carried)
            eol = data.find(b"\r\n", pos)
            if eol < 0:
                self._pending = data[pos:]
                if len(self._pending) > 1024:
                    raise HttpParseError("chunk size line too long")
                return n - carried
            try:
                size = int(data[pos:eol].split(b";", 1)[0], 16)
            except ValueError:
                raise HttpParseError(f"bad chunk size {data[pos:eol][:40]!r}") from None
            pos = eol + 2
            if size == 0:
                self._trailer = True
            else:
                self._left = size + 2
        return n - carried

    def body(self) -> bytes:
        return b"".join(self.parts or ())


def encode_chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)
