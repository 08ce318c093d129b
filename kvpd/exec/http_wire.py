"""HTTP/1.1 over one byte stream (a TCP socket, or an SSH channel to a port on a host): the
request written here, the answer read by the standard library's parser (status line, headers,
Content-Length or chunked body). One exchange per stream, closed after the answer, so a stream
is never shared and a slow answer holds nothing else up. No `Connection: close` header: the
memcache MetaService's HTTP server drops the body of answers to it."""

from __future__ import annotations

import http.client
import socket
import urllib.parse
from dataclasses import dataclass
from typing import Any

from kvpd.exec.transport import ChannelError, HttpMethod, HttpRequest, HttpResponse

# An answer larger than this is not one kvpd asks for (/metrics of a big engine is ~1 MiB).
MAX_BODY = 64 * 1024 * 1024


# A socket.socket or a paramiko.Channel: both have sendall, settimeout and makefile("rb")
# (typeshed's overloads of socket.makefile fit no Protocol both satisfy).
Stream = Any


@dataclass(frozen=True)
class Endpoint:
    """An http:// URL split into what a channel needs: where to connect and what to ask."""

    address: str
    port: int
    path: str  # with the query, always starting with "/"

    def request(
        self,
        method: HttpMethod = "GET",
        *,
        body: bytes | None = None,
        headers: tuple[tuple[str, str], ...] = (),
        timeout_s: float = 10.0,
    ) -> HttpRequest:
        return HttpRequest(method, self.address, self.port, self.path, body, headers, timeout_s)


def endpoint(url: str, path: str = "") -> Endpoint:
    """`url` (http://address:port/base) with `path` appended; ValueError when it is not one."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"not an http://host:port URL: {url!r}")
    port = parts.port or 80  # ValueError for a port out of range
    base = parts.path.rstrip("/") if path else (parts.path or "/")
    full = base + path
    if parts.query and not path:
        full += "?" + parts.query
    return Endpoint(parts.hostname, port, full or "/")


def encode(req: HttpRequest) -> bytes:
    """The request's bytes (HttpRequest refuses values that would end a line or the head)."""
    host = f"[{req.address}]" if ":" in req.address else req.address
    head = [
        (f"{req.method} {req.path} HTTP/1.1"),
        f"Host: {host}:{req.port}",
        "Accept: */*",
        "User-Agent: kvpd",
    ]
    if req.body is not None:
        head.append(f"Content-Length: {len(req.body)}")
    head += [f"{k}: {v}" for k, v in req.headers]
    text = "\r\n".join(head)
    return (text + "\r\n\r\n").encode("latin-1") + (req.body or b"")


def exchange(stream: Stream, req: HttpRequest, host: str) -> HttpResponse:
    """Send `req` on `stream` and read the whole answer (raises ChannelError)."""
    where = f"{req.method} http://{req.address}:{req.port}{req.path} on {host}"
    stream.settimeout(req.timeout_s)
    try:
        stream.sendall(encode(req))
        resp = http.client.HTTPResponse(stream)
        try:
            resp.begin()
            if resp.length is not None and resp.length > MAX_BODY:
                raise ChannelError(
                    "bad-answer",
                    f"answer of {resp.length} bytes",
                    f"{where}: the answer is {resp.length} bytes, more than kvpd reads "
                    f"({MAX_BODY}).",
                )
            body = resp.read()
        finally:
            resp.close()
    except TimeoutError:
        raise ChannelError(
            "timeout",
            f"timed out after {req.timeout_s:g}s",
            f"{where}: no answer within {req.timeout_s:g}s. Fix: check that the process is "
            "not stuck (`kvpd logs NAME`).",
        ) from None
    except (http.client.HTTPException, OSError, EOFError, ValueError) as e:
        why = str(e) or type(e).__name__
        raise ChannelError(
            "bad-answer",
            f"no valid HTTP answer ({why})",
            f"{where}: the port accepted the connection but gave no valid HTTP answer "
            f"({why}). Fix: check that the right process listens on port {req.port}.",
        ) from None
    return HttpResponse(resp.status, body)


def connect(address: str, port: int, timeout_s: float, host: str) -> socket.socket:
    """A TCP connection from this machine (raises ChannelError): only for hosts this machine
    reaches without SSH (the local transport)."""
    try:
        sock = socket.create_connection((address, port), timeout=timeout_s)
    except ConnectionRefusedError:
        raise ChannelError(
            "refused",
            "connection refused",
            f"host {host}: port {port} refused on {address}: nothing listens there. "
            "Fix: check that the process runs (`kvpd status`, `kvpd logs NAME`).",
        ) from None
    except TimeoutError:
        raise ChannelError(
            "timeout",
            f"timed out after {timeout_s:g}s",
            f"host {host}: connecting to {address}:{port} timed out after {timeout_s:g}s. "
            "Fix: check the address and firewalls.",
        ) from None
    except OSError as e:
        why = (e.strerror or str(e)).lower()
        raise ChannelError(
            "unreachable",
            why,
            f"host {host}: cannot connect to {address}:{port}: {why}. Fix: check the "
            "address in the profile.",
        ) from None
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def direct(req: HttpRequest, host: str) -> HttpResponse:
    """The exchange over a plain TCP socket from this machine (the local transport)."""
    sock = connect(req.address, req.port, req.timeout_s, host)
    try:
        return exchange(sock, req, host)
    finally:
        sock.close()


def route_here(address: str, port: int, timeout_s: float = 2.0) -> bool:
    """Whether this machine has a network path to `address:port` (refused counts: the host
    answered). Only for deciding where a benchmark client may run: a client here connects
    there itself; kvpd's own exchanges with hosts go through their transports."""
    try:
        socket.create_connection((address, port), timeout=timeout_s).close()
    except ConnectionRefusedError:
        return True
    except OSError:  # no route, unreachable, timed out
        return False
    return True
