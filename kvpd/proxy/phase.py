"""A client connection's lifecycle (the phases ClientConnection moves through) and the
per-request facts it derives from the request head: whether the connection stays open, and the
proxy's own error answers."""

from __future__ import annotations

import enum
from http import HTTPStatus

from kvpd.proxy.relay import error_body


class Phase(enum.Enum):
    """Where a client connection is in its requests. Only ClientConnection moves it, by its
    own methods: other modules begin, finish, break or drop a response through those, never
    by flags. Whether the transport is gone is a fact apart (`closed`): a connection can be
    lost in any phase."""

    FRESH = "fresh"  # accepted, not a byte received yet
    IDLE = "idle"  # no request running (between requests, or the next one arriving)
    HANDLING = "handling"  # a request dispatched, nothing of its answer sent (a retry is safe)
    RESPONDING = "responding"  # its answer has started going out


def keeps_alive(http10: bool, connection: bytes | None) -> bool:
    """HTTP/1.1 keeps the connection unless the client says close; HTTP/1.0 closes it unless
    the client asks for keep-alive (and then the answer says keep-alive too). Connection is a
    token list, in any case."""
    if not connection:
        return not http10
    tokens = [t.strip() for t in connection.lower().split(b",")]
    return b"keep-alive" in tokens if http10 else b"close" not in tokens


def error(message: str, status: int) -> bytes:
    """vLLM's error shape, e.g. {"error": {"message": ..., "type": "BadRequestError",
    "code": 400}}, serialised (never formatted: a message may hold any character)."""
    kind = HTTPStatus(status).phrase.title().replace(" ", "").replace("-", "") + "Error"
    return error_body(message, kind, status)
