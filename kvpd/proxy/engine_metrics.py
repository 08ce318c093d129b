"""GET /metrics/engines: every engine's own Prometheus metrics in one answer, under their names.

Each engine serves its metrics (vLLM's `vllm:*`, its process's) at its `/metrics`; a scraper that
sees only the proxy gets them here, every sample labelled with the engine's role and name
(`role="decode",backend="decode-0"`, the names of the proxy's own `kvpd_proxy_backend_*`
series), one HELP and TYPE per family whatever the number of engines (the text format wants a
family's samples together). `kvpd_proxy_engine_metrics_up{role,backend}` says which engines
answered: one that did not is missing from this scrape, not an error of the whole.

An engine's text is untrusted: only lines of the text format's shape are kept (a sample, HELP,
TYPE), each at most 64 KiB; anything else is dropped. A label the engine already calls `role`
or `backend` is kept as `exported_role` / `exported_backend` (Prometheus' own convention)."""

from __future__ import annotations

import asyncio
import re
from typing import TYPE_CHECKING

from kvpd.proxy.hostpool import fetch
from kvpd.proxy.upstream import UpstreamError

if TYPE_CHECKING:
    from kvpd.proxy.backends import Backend, BackendPool
    from kvpd.proxy.flows import BackendAuth
    from kvpd.proxy.routing import Request
    from kvpd.proxy.server import ClientConnection

FETCH_TIMEOUT_S = 5.0
MAX_LINE = 64 * 1024
CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"

_NAME = rb"[a-zA-Z_:][a-zA-Z0-9_:]*"
_SAMPLE = re.compile(rb"(" + _NAME + rb")(?:\{(.*)\})?[ \t]+([-+0-9.eEInfNa]+)((?:[ \t]+-?\d+)?)")
_META = re.compile(rb"# (HELP|TYPE) (" + _NAME + rb")(?: (.*))?")
_OURS = re.compile(rb'(^|,)\s*(role|backend)="')
_SUFFIXES = (b"_bucket", b"_sum", b"_count", b"_total", b"_created", b"_info", b"_gsum", b"_gcount")


class Family:
    __slots__ = ("help", "type", "samples")

    def __init__(self) -> None:
        self.help = b""
        self.type = b""
        self.samples: list[bytes] = []


def _labelled(labels: bytes | None, ours: bytes) -> bytes:
    if not labels:
        return ours
    return ours + b"," + _OURS.sub(rb'\1exported_\2="', labels)


def _family_of(name: bytes, current: bytes, families: dict[bytes, Family]) -> bytes:
    """The family a sample belongs to: the one its HELP/TYPE named last if the sample's name
    is that name or that name plus a suffix of the text format, else one of its own."""
    if current and (name == current or (name.startswith(current)
                                        and name[len(current):] in _SUFFIXES)):  # fmt: skip
        return current
    families.setdefault(name, Family())
    return name


def merge(text: bytes, ours: bytes, families: dict[bytes, Family]) -> None:
    """Add one engine's metrics to `families`, each sample with the labels `ours`."""
    current = b""
    for line in text.split(b"\n"):
        line = line.rstrip(b"\r")
        if not line or len(line) > MAX_LINE:
            continue
        if line.startswith(b"#"):
            m = _META.fullmatch(line)
            if m is None:
                continue  # another comment
            kind, name, rest = m.groups()
            fam = families.setdefault(name, Family())
            if kind == b"HELP" and not fam.help:
                fam.help = rest or b""
            elif kind == b"TYPE" and not fam.type:
                fam.type = rest or b"untyped"
            current = name
            continue
        s = _SAMPLE.fullmatch(line)
        if s is None:
            continue
        name, labels, value, stamp = s.groups()
        fam = families[_family_of(name, current, families)]
        fam.samples.append(name + b"{" + _labelled(labels, ours) + b"} " + value + stamp)


def render(families: dict[bytes, Family], up: list[tuple[str, str, bool]]) -> bytes:
    out = [
        b"# HELP kvpd_proxy_engine_metrics_up 1 if the engine answered its /metrics for this "
        b"scrape.",
        b"# TYPE kvpd_proxy_engine_metrics_up gauge",
    ]
    for role, backend, ok in up:
        out.append(f'kvpd_proxy_engine_metrics_up{{role="{role}",backend="{backend}"}} {int(ok)}'
                   .encode())  # fmt: skip
    for name, fam in families.items():
        if not fam.samples:
            continue
        if fam.help:
            out.append(b"# HELP " + name + b" " + fam.help)
        if fam.type:
            out.append(b"# TYPE " + name + b" " + fam.type)
        out.extend(fam.samples)
    out.append(b"")
    return b"\n".join(out)


def _label_value(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class EngineMetrics:
    """The route's handler: fetches every engine's /metrics at once, merges them."""

    def __init__(self, pools: list[BackendPool], auth: BackendAuth) -> None:
        self.pools = pools
        self.auth = auth

    async def _one(self, backend: Backend, extra: bytes) -> bytes | None:
        try:
            resp = await fetch(backend.pool, b"GET", b"/metrics", b"", FETCH_TIMEOUT_S, extra)
        except UpstreamError:
            return None
        return resp.body if resp.status == 200 else None

    async def handle(self, client: ClientConnection, req: Request) -> None:
        extra = self.auth.header(req)
        backends = [(pool.role, b) for pool in self.pools for b in pool.backends]
        bodies = await asyncio.gather(*(self._one(b, extra) for _, b in backends))
        families: dict[bytes, Family] = {}
        up = []
        for (role, backend), body in zip(backends, bodies, strict=True):
            up.append((role, backend.name, body is not None))
            if body is not None:
                ours = f'role="{_label_value(role)}",backend="{_label_value(backend.name)}"'
                merge(body, ours.encode(), families)
        client.send(200, render(families, up), CONTENT_TYPE)
