"""The urllib opener for requests that carry credentials (the proxy's admin token, its client
key): no proxy from the environment (the endpoints are cluster nodes), and no redirects
followed, since urllib would send the Authorization header again to wherever a 3xx points.
A redirect becomes an HTTPError that the caller reports like any other answer."""

from __future__ import annotations

import urllib.request
from email.message import Message
from typing import IO


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: IO[bytes],
        code: int,
        msg: str,
        headers: Message,
        newurl: str,
    ) -> None:
        return None


def opener() -> urllib.request.OpenerDirector:
    return urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect())
