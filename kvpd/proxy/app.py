"""The proxy process: wires config, backend pools, health checks, flows and routes; serves until
SIGTERM/SIGINT and then shuts down within the grace period."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys

from kvpd.proxy.backends import Backend, BackendPool, HealthChecker
from kvpd.proxy.config import ProxyConfig, ProxyConfigError, parse_args
from kvpd.proxy.flows import Flows
from kvpd.proxy.metrics import ProxyMetrics
from kvpd.proxy.relay import error_body
from kvpd.proxy.server import ClientConnection, Request, Router, ServerState
from kvpd.proxy.upstream import HostPool, UpstreamError, fetch

log = logging.getLogger("kvpd.proxy")


class ProxyApp:
    def __init__(self, cfg: ProxyConfig, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.cfg = cfg
        self.loop = loop or asyncio.get_running_loop()
        self.metrics = ProxyMetrics()

        def pool(role: str, addrs: list[tuple[str, int]]) -> BackendPool:
            return BackendPool(
                role, [Backend(HostPool(h, p, self.loop, cfg.connect_timeout)) for h, p in addrs]
            )

        self.prefillers = pool("prefill", cfg.prefillers)
        self.decoders = pool("decode", cfg.decoders)
        self.health = HealthChecker(
            [self.prefillers, self.decoders], cfg.health_path, cfg.health_interval,
            cfg.health_timeout,
        )  # fmt: skip
        self.flows = Flows(self)
        router = Router()
        router.add_async("POST", "/v1/completions", self.flows.completions)
        router.add_async("POST", "/v1/chat/completions", self.flows.chat_completions)
        router.add_async("POST", "/v1/metaserver", self.flows.layerwise.metaserver)
        router.add_async("GET", "/v1/models", self.models)
        router.add_async("POST", "/reset_prefix_cache", self.reset_prefix_cache)
        router.add("GET", "/health", self.health_endpoint)
        router.add("GET", "/healthcheck", self.healthcheck)
        router.add("GET", "/metrics", self.metrics_endpoint)
        self.state = ServerState(router, self.loop, cfg.access_log)
        self.server: asyncio.AbstractServer | None = None
        self._health_task: asyncio.Task[None] | None = None
        self.stopping = asyncio.Event()

    @property
    def port(self) -> int:
        assert self.server is not None
        return self.server.sockets[0].getsockname()[1]

    async def start(self) -> None:
        self.server = await self.loop.create_server(
            lambda: ClientConnection(self.state), self.cfg.host, self.cfg.port, backlog=2048
        )
        if self.cfg.port == 0 and self.cfg.flow == "layerwise" and not self.cfg.metaserver_url:
            self.cfg.port = self.port  # the metaserver URL needs the real port
            self.flows.layerwise.set_metaserver(self.cfg.metaserver)
        self._health_task = self.loop.create_task(self.health.run())

    async def stop(self) -> None:
        """Stop listening, let in-flight requests finish for the grace period, then cut."""
        if self.server is not None:
            self.server.close()
        if self._health_task is not None:
            self._health_task.cancel()
        tasks = list(self.state.tasks)
        if tasks:
            await asyncio.wait(tasks, timeout=self.cfg.shutdown_grace)
        for task in list(self.state.tasks):
            task.cancel()
        for conn in list(self.state.connections):
            conn.abort()
        self.prefillers.close()
        self.decoders.close()
        await asyncio.sleep(0)

    # --- small endpoints ---------------------------------------------------------------------
    def health_endpoint(self, client: ClientConnection, req: Request) -> None:
        p_ok = self.cfg.flow == "mixed" or self.prefillers.any_healthy()
        d_ok = self.decoders.any_healthy()
        if p_ok and d_ok:
            client.send_json(200, b'{"status":"ok"}')
            return
        missing = [r for r, ok in (("prefiller", p_ok), ("decoder", d_ok)) if not ok]
        client.send_json(
            503,
            json.dumps({"status": "unavailable", "no_healthy": missing}).encode(),
        )

    def healthcheck(self, client: ClientConnection, req: Request) -> None:
        ready = (
            self.cfg.flow == "mixed" or self.prefillers.any_healthy()
        ) and self.decoders.any_healthy()
        body = {
            "status": "ok" if ready else "unavailable",
            "flow": self.cfg.flow,
            "prefill_instances": [b.describe() for b in self.prefillers.backends],
            "decode_instances": [b.describe() for b in self.decoders.backends],
            "request_num": self.metrics.inflight,
            "health_rounds": self.health.rounds,
        }
        client.send_json(200, json.dumps(body).encode())

    def metrics_endpoint(self, client: ClientConnection, req: Request) -> None:
        client.send(
            200,
            self.metrics.render(self.prefillers, self.decoders),
            b"text/plain; version=0.0.4; charset=utf-8",
        )

    async def models(self, client: ClientConnection, req: Request) -> None:
        """GET /v1/models from a healthy decoder (then any prefiller)."""
        extra = self.flows.auth_header(req)
        problems = []
        candidates = [b for b in self.decoders.backends if b.usable]
        candidates += [b for b in self.prefillers.backends if b.usable]
        for backend in candidates:
            try:
                resp = await fetch(backend.pool, b"GET", b"/v1/models", b"", 3.0, extra)
            except UpstreamError as e:
                problems.append(str(e))
                continue
            if resp.status == 200:
                client.send_json(200, resp.body)
                return
            problems.append(f"{backend.name} answered HTTP {resp.status}")
        msg = "no backend answered /v1/models: " + ("; ".join(problems) or "none is healthy")
        client.send_json(503, error_body(msg, "no_backend", 503))

    async def reset_prefix_cache(self, client: ClientConnection, req: Request) -> None:
        extra = self.flows.auth_header(req)
        backends = self.prefillers.backends + self.decoders.backends

        async def one(b: Backend) -> str:
            try:
                r = await fetch(b.pool, b"POST", b"/reset_prefix_cache", b"", 10.0, extra)
            except UpstreamError as e:
                return str(e)
            return "" if r.status == 200 else f"{b.name} answered HTTP {r.status}"

        failed = [p for p in await asyncio.gather(*(one(b) for b in backends)) if p]
        if failed:
            client.send_json(500, error_body("; ".join(failed), "reset_failed", 500))
        else:
            client.send_json(200, b'{"status":"ok"}')


def _install_loop() -> None:
    try:
        import uvloop
    except ImportError:  # plain asyncio works, just slower
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


async def serve(cfg: ProxyConfig) -> None:
    app = ProxyApp(cfg)
    try:
        await app.start()
    except OSError as e:
        raise ProxyConfigError(
            f"cannot listen on {cfg.host}:{cfg.port}: {e.strerror or e} "
            "(is another process using the port? choose another with --port)"
        ) from None
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, app.stopping.set)
    log.info(
        "kvpd proxy (%s) listening on %s:%d; prefillers %s; decoders %s",
        cfg.flow,
        cfg.host,
        app.port,
        " ".join(b.name for b in app.prefillers.backends),
        " ".join(b.name for b in app.decoders.backends),
    )
    await app.stopping.wait()
    log.info("stopping")
    await app.stop()


def run(cfg: ProxyConfig) -> None:
    logging.basicConfig(
        level=getattr(logging, cfg.log_level, logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    _install_loop()
    asyncio.run(serve(cfg))


def run_from_argv(argv: list[str]) -> None:
    run(parse_args(argv))
