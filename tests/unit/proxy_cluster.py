"""Shared by the proxy tests: a plain HTTP client, and a proxy in front of in-process stand-in
backends on ephemeral loopback ports."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from kvpd.proxy.app import ProxyApp
from kvpd.proxy.config import ProxyConfig
from kvpd.proxy.http1 import ChunkedReader
from kvpd.testing.backend import StandInBackend


class Reply:
    def __init__(self, status: int, headers: dict[str, str], body: bytes, complete: bool) -> None:
        self.status = status
        self.headers = headers
        self.body = body
        self.complete = complete  # False when the connection broke before the body's end

    def json(self) -> Any:
        return json.loads(self.body)

    def events(self) -> list[str]:
        return [e[6:] for e in self.body.decode().split("\n\n") if e.startswith("data: ")]


async def call(
    port: int,
    method: str,
    path: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
) -> Reply:
    """A plain HTTP/1.1 request on its own connection (read to EOF)."""
    data = b"" if body is None else json.dumps(body).encode()
    lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Connection: close"]
    if body is not None:
        lines += ["Content-Type: application/json", f"Content-Length: {len(data)}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + data)
    raw = b""
    try:
        raw = await reader.read()
    except ConnectionResetError:
        pass
    writer.close()
    head, _, rest = raw.partition(b"\r\n\r\n")
    status_line, *hdr_lines = head.decode().split("\r\n")
    hdrs = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in hdr_lines)}
    if hdrs.get("transfer-encoding") == "chunked":
        reader_ = ChunkedReader(collect=True)
        reader_.feed(rest)
        return Reply(int(status_line.split()[1]), hdrs, reader_.body(), reader_.done)
    complete = len(rest) == int(hdrs.get("content-length", len(rest)))
    return Reply(int(status_line.split()[1]), hdrs, rest, complete)


class Cluster:
    def __init__(
        self, app: ProxyApp, prefillers: list[StandInBackend], decoders: list[StandInBackend]
    ):
        self.app = app
        self.p = prefillers
        self.d = decoders

    @property
    def port(self) -> int:
        return self.app.port

    async def call(self, method: str, path: str, body: Any = None, **kw: Any) -> Reply:
        return await call(self.port, method, path, body, **kw)

    def metric(self, line_prefix: str) -> float:
        app = self.app
        text = app.metrics.render(app.prefillers, app.decoders, app.state).decode()
        for line in text.splitlines():
            if line.startswith(line_prefix + " "):
                return float(line.rsplit(" ", 1)[1])
        raise KeyError(line_prefix)


def run_cluster(
    test: Callable[[Cluster], Awaitable[None]],
    n_prefill: int = 1,
    n_decode: int = 1,
    decode_delay: float = 0.0,
    **cfg: Any,
) -> None:
    async def main() -> None:
        prefillers = [await StandInBackend("prefill").start() for _ in range(n_prefill)]
        decoders = [
            await StandInBackend("decode", delay_s=decode_delay, chunks=4).start()
            for _ in range(n_decode)
        ]
        config = ProxyConfig(
            port=0,
            prefillers=[("127.0.0.1", b.port) for b in prefillers],
            decoders=[("127.0.0.1", b.port) for b in decoders],
            **{"health_interval": 30.0, "retry_delay": 0.0, **cfg},
        )
        app = ProxyApp(config)
        await app.start()
        await app.health.wait_round()
        try:
            await test(Cluster(app, prefillers, decoders))
        finally:
            await app.stop()
            for b in prefillers + decoders:
                await b.stop()

    asyncio.run(main())


CLIENT_KEY = "client-key-0123456789abcdef-0123456789"
CLIENT_AUTH = {"Authorization": f"Bearer {CLIENT_KEY}"}
COMPLETION = {
    "model": "fake",
    "prompt": "Hello there, how are you?",
    "max_tokens": 8,
    "min_tokens": 2,
    "stream": True,
    "stream_options": {"include_usage": True},
}
CHAT = {
    "model": "fake",
    "messages": [{"role": "user", "content": "Hi!"}],
    "max_completion_tokens": 8,
}
PREFILL_KV = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}
