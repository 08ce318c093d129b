"""What each memcache-hybrid release accepts and prints, for rendering and readiness (pure).

`ock.mmc.meta_service.metrics_url` and the MetaService's HTTP `/health` are documented from 1.3;
the guide installs 1.2, whose parser fails on a key it does not know, so the key is rendered only
for `kv.memcache.version: "1.3"`. The ready line `Meta Service launched successfully` is logged
at WARNING level: with the guide's `log_level = error` it is never printed. Readiness is then
the meta RPC port listening while the process lives.
"""

from __future__ import annotations

from kvpd.profile.kv_schema import Memcache

READY_LINE = "Meta Service launched successfully"
HTTP_SINCE = (1, 3)


def version_tuple(mc: Memcache) -> tuple[int, ...]:
    return tuple(int(x) for x in mc.version.split("."))


def has_http(mc: Memcache) -> bool:
    """The release serves metrics_url (and /health on it)."""
    return version_tuple(mc) >= HTTP_SINCE


def ready_line(mc: Memcache) -> str:
    """The log line that says the MetaService is up, or "" when its log level hides it."""
    return "" if mc.log_level == "error" else READY_LINE
