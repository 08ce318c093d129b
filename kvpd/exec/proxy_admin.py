"""The controller's client of the proxy's admin interface (kvpd/proxy/admin.py): drain,
re-admit and list backends, with the deployment's token, through the transport of the proxy's
host (the admin port need not be reachable from the controller)."""

from __future__ import annotations

import json
from typing import Any

from kvpd.errors import DeployError
from kvpd.exec.http_wire import endpoint
from kvpd.exec.transport import ChannelError, HttpMethod, Transport


class ProxyAdmin:
    def __init__(
        self, transport: Transport, base_url: str, token: str, timeout_s: float = 10.0
    ) -> None:
        self.transport = transport
        self.base = base_url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s

    def _call(self, method: str, path: str, body: dict[str, Any] | None, wait_s: float) -> Any:
        headers = [("Content-Type", "application/json")]
        if self.token:
            headers.append(("Authorization", f"Bearer {self.token}"))
        data = json.dumps(body).encode() if body is not None else None
        verb: HttpMethod = "POST" if method == "POST" else "GET"
        try:
            req = endpoint(self.base, path).request(
                verb, body=data, headers=tuple(headers), timeout_s=self.timeout_s + wait_s
            )
            resp = self.transport.http(req)
        except (ChannelError, ValueError) as e:
            raise DeployError(f"proxy admin {method} {self.base}{path} failed: {e}") from None
        if resp.status >= 300:  # a redirect is never followed: the token would go along
            text = resp.body.decode("utf-8", "replace")[:300]
            raise DeployError(f"proxy admin {method} {path}: HTTP {resp.status} {text}")
        try:
            return json.loads(resp.body or b"{}")
        except ValueError as e:
            raise DeployError(
                f"proxy admin {method} {self.base}{path}: the answer is not JSON ({e})"
            ) from None

    def backends(self) -> list[dict[str, Any]]:
        return list(self._call("GET", "/admin/backends", None, 0).get("backends", []))

    def drain(self, backend: str, timeout_s: float = 60.0) -> dict[str, Any]:
        """No new requests to `backend`; returns once its in-flight ones are done (`drained`)
        or after `timeout_s`."""
        body = {"backend": backend, "timeout": timeout_s}
        return dict(self._call("POST", "/admin/drain", body, timeout_s))

    def admit(self, backend: str) -> dict[str, Any]:
        return dict(self._call("POST", "/admin/admit", {"backend": backend}, 0))
