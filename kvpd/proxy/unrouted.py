"""Answers for requests no route takes, as vLLM (FastAPI/Starlette) gives them: a CORS
preflight, a known path with another method (405 with Allow), a path that differs from a
served one by a trailing slash (307 to it), anything else 404."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvpd.proxy.routing import Request, Router

# vLLM's CORS defaults (--allowed-origins [], methods and headers "*"): Starlette answers every
# preflight 400 "Disallowed CORS origin" with these headers, the requested headers mirrored.
# The proxy allows no origin either (a browser page must not reach the engines).
_CORS_PREFLIGHT = (
    b"vary: Origin, Access-Control-Request-Method, Access-Control-Request-Headers, "
    b"Access-Control-Request-Private-Network\r\n"
    b"access-control-allow-methods: DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT, QUERY\r\n"
    b"access-control-max-age: 600\r\n"
)


def is_preflight(req: Request) -> bool:
    """A CORS preflight: answered before the client gate, as vLLM's authentication lets
    OPTIONS through (a browser sends no credentials with it; the answer reveals nothing)."""
    h = req.headers
    return req.method == b"OPTIONS" and b"origin" in h and b"access-control-request-method" in h


def unrouted(router: Router, req: Request) -> tuple[int, bytes | None, bytes, bytes]:
    """(status, body, content type, extra header lines); body None: the proxy's JSON error
    for the status."""
    if is_preflight(req):
        extra = _CORS_PREFLIGHT
        requested = req.headers.get(b"access-control-request-headers")
        if requested is not None:
            extra += b"access-control-allow-headers: " + requested + b"\r\n"
        return 400, b"Disallowed CORS origin", b"text/plain; charset=utf-8", extra
    methods = router.paths.get(req.path)
    if methods is not None:
        return 405, None, b"application/json", b"allow: " + b", ".join(methods) + b"\r\n"
    alt = router.slash_alternative(req.path)
    if alt is not None:
        host = req.headers.get(b"host", b"")
        target = alt + (b"?" + req.query if req.query else b"")
        location = b"http://" + host + target if host else target
        return 307, b"", b"text/plain", b"location: " + location + b"\r\n"
    return 404, None, b"application/json", b""
