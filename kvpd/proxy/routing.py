"""Requests as the server hands them to handlers, and the routes from (method, path) to
handlers."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvpd.proxy.apis import GenerationRoute
    from kvpd.proxy.server import ClientConnection


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


@dataclass(frozen=True, slots=True)
class GenerationCall:
    """One parsed generation request, as the entry point hands it to the flow."""

    client: ClientConnection
    req: Request
    body: dict[str, Any]  # the client's JSON body; flows rewrite copies of it
    route: GenerationRoute
    request_id: str
    extra: bytes  # header lines sent to every backend (request id, authorization)


SyncHandler = Callable[["ClientConnection", Request], None]
AsyncHandler = Callable[["ClientConnection", Request], Awaitable[None]]


class Router:
    def __init__(self) -> None:
        self.sync: dict[tuple[bytes, bytes], SyncHandler] = {}
        self.async_: dict[tuple[bytes, bytes], AsyncHandler] = {}
        self.paths: dict[bytes, list[bytes]] = {}  # path -> its methods (a 405's Allow)

    def add(self, method: str, path: str, handler: SyncHandler) -> None:
        self.sync[(method.encode(), path.encode())] = handler
        self.paths.setdefault(path.encode(), []).append(method.encode())

    def add_async(self, method: str, path: str, handler: AsyncHandler) -> None:
        self.async_[(method.encode(), path.encode())] = handler
        self.paths.setdefault(path.encode(), []).append(method.encode())

    def slash_alternative(self, path: bytes) -> bytes | None:
        """The served path this one differs from by a trailing slash (Starlette redirects)."""
        alt = path[:-1] if path.endswith(b"/") else path + b"/"
        return alt if alt and alt in self.paths else None
