"""Minimal HTTP/1.1 framing shared by the proxy's server and client: strict request heads,
response heads and chunked bodies.

The request side is deliberately strict (RFC 9112 without the tolerances): the proxy forwards
bodies to backends, so any framing two parsers could read differently (Content-Length with
Transfer-Encoding, repeated or odd Content-Length, obsolete line folding, bare LF, chunk sizes
with signs or spaces) is refused with a 4xx instead of guessed at."""

from __future__ import annotations

import re
from http import HTTPStatus

MAX_HEAD_BYTES = 64 * 1024
MAX_REQUEST_LINE = 8 * 1024
MAX_HEADERS = 100
MAX_BODY_BYTES = 64 * 1024 * 1024
_REASONS = {s.value: s.phrase for s in HTTPStatus}

_TOKEN = re.compile(rb"[-!#$%&'*+.^_`|~0-9A-Za-z]+")
_TARGET = re.compile(rb"/[\x21-\x7e]*")  # origin-form only: the proxy is no forward proxy
# name ":" OWS value OWS, the value without control characters (HTAB allowed inside)
_HEADER_LINE = re.compile(rb"([-!#$%&'*+.^_`|~0-9A-Za-z]+):[ \t]*([^\x00-\x08\x0a-\x1f\x7f]*)")
_HEX_DIGITS = b"0123456789abcdefABCDEF"
# Headers whose repetition would make two readers disagree (framing, routing, credentials):
# refused, never "last one wins".
SINGLE_HEADERS = frozenset(
    (b"content-length", b"transfer-encoding", b"host", b"authorization", b"content-type",
     b"expect", b"connection", b"x-request-id")
)  # fmt: skip


class HttpParseError(Exception):
    """The peer sent bytes that are not valid HTTP/1.1 framing; `status` is the answer."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class RequestHead:
    __slots__ = ("method", "target", "version", "headers", "length")

    def __init__(
        self,
        method: bytes,
        target: bytes,
        version: bytes,
        headers: dict[bytes, bytes],
        length: int,
    ) -> None:
        self.method = method
        self.target = target
        self.version = version
        self.headers = headers
        self.length = length  # body bytes; -1 = chunked


def parse_headers(lines: list[bytes]) -> dict[bytes, bytes]:
    """Response header lines to a dict keyed by lower-case name (repeated names keep the last
    value: the backends are trusted, and only their framing headers are read)."""
    headers: dict[bytes, bytes] = {}
    for line in lines:
        name, sep, value = line.partition(b":")
        if not sep:
            raise HttpParseError(f"malformed header line {line[:60]!r}")
        headers[name.strip().lower()] = value.strip()
    return headers


def find_head_end(buf: bytes) -> int:
    """Index of the blank line ending a request head, -1 if incomplete. A bare LF anywhere in
    the head is refused at once (some parsers end lines at LF alone: a smuggling shape)."""
    end = buf.find(b"\r\n\r\n")
    stop = len(buf) if end < 0 else end
    if buf.count(b"\n", 0, stop) != buf.count(b"\r\n", 0, stop):
        raise HttpParseError("bare LF in the request head (lines must end with CRLF)")
    return end


def parse_request_head(head: bytes) -> RequestHead:
    """`METHOD /target HTTP/1.1\\r\\nName: value...` (without the blank line), validated."""
    lines = head.split(b"\r\n")
    method, target, version = _request_line(lines[0])
    if len(lines) - 1 > MAX_HEADERS:
        raise HttpParseError(f"more than {MAX_HEADERS} header lines", 431)
    headers = _request_headers(lines)
    if version == b"HTTP/1.1" and b"host" not in headers:
        raise HttpParseError("HTTP/1.1 request without a Host header")
    return RequestHead(method, target, version, headers, _body_length(headers, version))


def _request_line(line: bytes) -> list[bytes]:
    """The request line's method, origin-form target and version (1.1 or 1.0), validated."""
    if len(line) > MAX_REQUEST_LINE:
        raise HttpParseError("request line too long", 414)
    parts = line.split(b" ")
    if len(parts) != 3:
        raise HttpParseError("malformed request line (expected METHOD TARGET HTTP/1.1)")
    method, target, version = parts
    if _TOKEN.fullmatch(method) is None:
        raise HttpParseError("invalid method")
    if _TARGET.fullmatch(target) is None:
        raise HttpParseError("invalid request target (expected a path such as /v1/completions)")
    if version != b"HTTP/1.1" and version != b"HTTP/1.0":
        if re.fullmatch(rb"HTTP/[0-9]\.[0-9]", version):
            raise HttpParseError("HTTP version not supported", 505)
        raise HttpParseError("malformed HTTP version")
    return parts


def _request_headers(lines: list[bytes]) -> dict[bytes, bytes]:
    """The header lines after the request line, keyed by lower-case name; a repeated name is
    joined with ", " unless it is one of SINGLE_HEADERS (refused)."""
    headers: dict[bytes, bytes] = {}
    for hline in lines[1:]:
        m = _HEADER_LINE.fullmatch(hline)
        if m is None:
            # obs-fold (a line starting with SP/HTAB), space before the colon, no colon, a bad
            # name, or a control character in the value
            raise HttpParseError("malformed header line or control character in a value")
        name, value = m.groups()
        value = value.rstrip(b" \t")
        if not value.isascii():
            try:
                value.decode()
            except UnicodeDecodeError:
                raise HttpParseError("header value is not valid UTF-8") from None
        key = name.lower()
        if key in headers:
            if key in SINGLE_HEADERS:
                raise HttpParseError(f"repeated {key.decode()} header")
            headers[key] += b", " + value
        else:
            headers[key] = value
    return headers


def _body_length(headers: dict[bytes, bytes], version: bytes) -> int:
    te = headers.get(b"transfer-encoding")
    cl = headers.get(b"content-length")
    if te is not None:
        if cl is not None:
            raise HttpParseError("both Content-Length and Transfer-Encoding")
        if version != b"HTTP/1.1":
            raise HttpParseError("Transfer-Encoding in an HTTP/1.0 request")
        if te.lower() != b"chunked":
            raise HttpParseError("only Transfer-Encoding: chunked is supported")
        return -1
    if cl is None:
        return 0
    if not cl.isdigit() or not cl.isascii() or len(cl) > 18:
        raise HttpParseError("invalid Content-Length")
    n = int(cl)
    if n > MAX_BODY_BYTES:
        raise HttpParseError(f"body larger than {MAX_BODY_BYTES} bytes", 413)
    return n


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
    """Follows `Transfer-Encoding: chunked` framing across reads, strictly: hex sizes only
    (no sign, space or prefix), each chunk followed by exactly CRLF, a bounded total.

    The relay forwards the raw bytes and only needs to know where the body ends; the buffering
    side also wants the payload, so `collect` keeps the de-framed parts.
    """

    __slots__ = ("_left", "_crlf", "_trailer", "_pending", "_total", "_limit", "done", "parts")

    def __init__(self, collect: bool = False, limit: int = 0) -> None:
        self._left = 0  # data bytes left in the current chunk
        self._crlf = 0  # bytes of the CRLF after the chunk data still expected (0-2)
        self._trailer = False  # saw the last (zero-size) chunk; waiting for the final CRLF
        self._pending = b""  # an incomplete size line or trailer kept from the previous read
        self._total = 0
        self._limit = limit  # largest total payload, 0 = unbounded
        self.done = False
        self.parts: list[bytes] | None = [] if collect else None

    def feed(self, data: bytes) -> int:
        """Consume `data`; return how many of its bytes belong to this body (less than
        len(data) only when the body ended inside it).

        The loop takes one whole chunk per step without a call (the usual case); the helpers
        run only where a read cut a size line, a chunk or its CRLF (at most twice per read)
        and for the last chunk (once per body)."""
        if self.done:
            return 0
        carried = pos = 0
        if self._pending or self._left or self._crlf or self._trailer:
            data, carried, pos = self._carry_over(data)
        n = len(data)
        parts = self.parts
        while pos < n and not self.done:
            eol = data.find(b"\r\n", pos)
            if eol < 0:
                self._keep_size_line(data[pos:])
                return n - carried
            size_text = data[pos:eol]
            # plain hex digits only: int() would also take a sign, "0x", "_" and spaces
            if size_text.translate(None, _HEX_DIGITS) or not 0 < len(size_text) <= 16:
                size_text = _extended_size(size_text)
            size = int(size_text, 16)
            if self._limit:
                self._count(size)
            pos = eol + 2
            if size and pos + size + 2 <= n:  # the whole chunk is here (the usual case)
                end = pos + size
                if data[end : end + 2] != b"\r\n":
                    raise HttpParseError("chunk data not followed by CRLF")
                if parts is not None:
                    parts.append(data[pos:end])
                pos = end + 2
            else:  # the last chunk, or one this read cut
                pos = self._begin(data, pos, size)
        return max(0, pos - carried) if self.done else n - carried

    def _carry_over(self, data: bytes) -> tuple[bytes, int, int]:
        """What the previous read left: its kept bytes joined to `data` (their count), and
        the rest of a cut chunk or the trailer consumed; the position to go on from."""
        carried = len(self._pending)
        if carried:
            data = self._pending + data
            self._pending = b""
        if self._trailer:
            return data, carried, self._trailer_step(data, 0)
        return data, carried, self._resume(data, 0)

    def _begin(self, data: bytes, pos: int, size: int) -> int:
        """A chunk whose size line ends at `pos`: the last one (size 0, then the trailer) or
        one the read cut (its data and CRLF as far as they came); the new position."""
        if size == 0:
            self._trailer = True
            return self._trailer_step(data, pos)
        self._left = size
        self._crlf = 2
        return self._resume(data, pos)

    def _resume(self, data: bytes, pos: int) -> int:
        """The rest of a chunk's data and of its CRLF, as far as `data` goes."""
        n = len(data)
        left = self._left
        if left:
            take = n - pos if n - pos < left else left
            if self.parts is not None:
                self.parts.append(data[pos : pos + take])
            self._left = left - take
            pos += take
            if self._left:
                return pos
        expect = b"\r\n"[2 - self._crlf :]
        got = data[pos : pos + self._crlf]
        if got != expect[: len(got)]:
            raise HttpParseError("chunk data not followed by CRLF")
        self._crlf -= len(got)
        return pos + len(got)

    def _trailer_step(self, data: bytes, pos: int) -> int:
        """After the last chunk: the final CRLF, or a trailer ending in a blank line (kept
        until it is complete). Where the body ends (`done`), else len(data)."""
        n = len(data)
        if n - pos < 2:
            self._pending = data[pos:]
            return n
        if data[pos : pos + 2] == b"\r\n":
            end = pos + 2
        else:
            idx = data.find(b"\r\n\r\n", pos)
            if idx < 0:
                self._pending = data[pos:]
                if len(self._pending) > MAX_HEAD_BYTES:
                    raise HttpParseError("chunked trailer too long", 431)
                return n
            end = idx + 4
        self.done = True
        return end

    def _keep_size_line(self, rest: bytes) -> None:
        """An incomplete chunk size line, kept for the next read (bounded)."""
        self._pending = rest
        if len(rest) > 1024:
            raise HttpParseError("chunk size line too long")

    def _count(self, size: int) -> None:
        """The running total of a bounded body (the client's request; relayed bodies have
        no bound)."""
        self._total += size
        if self._total > self._limit:
            raise HttpParseError(f"body larger than {self._limit} bytes", 413)

    def between_chunks(self) -> bool:
        return not (self._left or self._crlf or self._pending or self._trailer or self.done)

    def body(self) -> bytes:
        return b"".join(self.parts or ())


def _extended_size(size_text: bytes) -> bytes:
    """A size line that is not plain hex: a chunk extension (`size;name=value`, ignored) or
    refused."""
    size_text = size_text.split(b";", 1)[0]
    if size_text.translate(None, _HEX_DIGITS) or not 0 < len(size_text) <= 16:
        raise HttpParseError(f"bad chunk size {size_text[:40]!r}")
    return size_text


def encode_chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)
