"""Which request id the engines get, and which client headers travel with it.

vLLM names a request after the client's `X-Request-Id` header, else its body's `request_id`
(`chatcmpl-<id>`, `cmpl-<id>`); the proxy keeps that id end to end by sending it as
`X-Request-Id` to the prefiller and the decoder alike, so the answer's id is the one a direct
call returns. Without one the proxy makes its own (32 hex digits). W3C trace context
(`traceparent`, `tracestate`) is passed on; no other client header is."""

from __future__ import annotations

import itertools
import logging
import os
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvpd.proxy.routing import Request

log = logging.getLogger("kvpd.proxy")

TRACE_HEADERS = (b"traceparent", b"tracestate")
# What may go into a header line: visible ASCII, at most 256 characters.
_HEADER_SAFE = re.compile(r"[\x21-\x7e]{1,256}")


def client_request_id(req: Request, body: dict[str, Any]) -> tuple[str, str]:
    """(the client's id if it can be sent on, else ""; the id it gave, else ""), the header
    first, as vLLM reads them."""
    given = req.headers.get(b"x-request-id")
    if given is not None:
        text = given.decode(errors="replace")
    else:
        value = body.get("request_id")
        text = value if isinstance(value, str) else ""
    return (text if text and _HEADER_SAFE.fullmatch(text) else ""), text


def log_replaced(given: str, request_id: str, why: str) -> None:
    """The mapping from a client's id to the one the engines and the answer carry."""
    log.info("client request id %r is served as %s (%s)", given[:80], request_id, why)


def backend_headers(req: Request, request_id: str) -> bytes:
    """The header lines every backend call of the request carries (authorization aside)."""
    line = b"X-Request-Id: " + request_id.encode() + b"\r\n"
    headers = req.headers
    if b"traceparent" not in headers and b"tracestate" not in headers:
        return line  # the usual case: no trace context
    lines = [line]
    for name in TRACE_HEADERS:
        value = headers.get(name)
        if value is not None:
            lines.append(name + b": " + value + b"\r\n")
    return b"".join(lines)


# The proxy's own ids: 16 random hex digits drawn at start, then a counter (32 in all).
# Unique within the process and across restarts, without a getrandom call per request; an id
# opens nothing (the layerwise metaserver checks a token of its own).
_OWN_IDS = itertools.count(int.from_bytes(os.urandom(8), "big") << 64 | 1)


def new_request_id() -> str:
    return f"{next(_OWN_IDS) & ((1 << 128) - 1):032x}"
