"""The controller's client of the proxy's admin interface (kvpd/proxy/admin.py): drain,
re-admit and list backends, with the deployment's token."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from kvpd.errors import DeployError
from kvpd.exec import nofollow

# No http_proxy from the environment, no redirects (they would carry the token elsewhere).
_OPENER = nofollow.opener()


class ProxyAdmin:
    def __init__(self, base_url: str, token: str, timeout_s: float = 10.0) -> None:
        self.base = base_url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s

    def _call(self, method: str, path: str, body: dict[str, Any] | None, wait_s: float) -> Any:
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data, headers, method=method)
        try:
            with _OPENER.open(req, timeout=self.timeout_s + wait_s) as resp:
                return json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as e:
            text = e.read().decode("utf-8", "replace")[:300]
            raise DeployError(f"proxy admin {method} {path}: HTTP {e.code} {text}") from None
        except (OSError, ValueError) as e:
            why = getattr(e, "reason", e)
            raise DeployError(f"proxy admin {method} {self.base}{path} failed: {why}") from None

    def backends(self) -> list[dict[str, Any]]:
        return list(self._call("GET", "/admin/backends", None, 0).get("backends", []))

    def drain(self, backend: str, timeout_s: float = 60.0) -> dict[str, Any]:
        """No new requests to `backend`; returns once its in-flight ones are done (`drained`)
        or after `timeout_s`."""
        body = {"backend": backend, "timeout": timeout_s}
        return dict(self._call("POST", "/admin/drain", body, timeout_s))

    def admit(self, backend: str) -> dict[str, Any]:
        return dict(self._call("POST", "/admin/admit", {"backend": backend}, 0))
