"""The proxy process: builds its parts from one ProxyConfig and passes each what it needs
(pools, metrics, loop, the chosen flow); serves until SIGTERM/SIGINT and then shuts down
within the grace period."""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import signal
import socket
import sys

from kvpd.proxy.admin import Admin
from kvpd.proxy.apis import GENERATION_PATHS, PASS_THROUGH, PassThrough
from kvpd.proxy.backends import Backend, BackendPool, HealthChecker
from kvpd.proxy.backlog import take_backlog
from kvpd.proxy.cache_aware import install_routing
from kvpd.proxy.config import ProxyConfig, ProxyConfigError, parse_args
from kvpd.proxy.engine_metrics import EngineMetrics
from kvpd.proxy.flows import BackendAuth, Generation, make_flow
from kvpd.proxy.hostpool import HostPool, fetch
from kvpd.proxy.layerwise import Layerwise
from kvpd.proxy.limits import ModelLimits
from kvpd.proxy.metrics import ProxyMetrics
from kvpd.proxy.relay import error_body
from kvpd.proxy.routing import Request, Router
from kvpd.proxy.server import ClientConnection, ClientGate, Limits, ServerState
from kvpd.proxy.steps import Steps
from kvpd.proxy.upstream import UpstreamError

log = logging.getLogger("kvpd.proxy")


class ProxyApp:
    def __init__(self, cfg: ProxyConfig, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.cfg = cfg
        self.loop = loop = loop or asyncio.get_running_loop()
        self.metrics = metrics = ProxyMetrics()

        def pool(role: str, addrs: tuple[tuple[str, int], ...]) -> BackendPool:
            backends = [
                Backend(HostPool(h, p, loop, cfg.connect_timeout, f"{role}-{i}"))
                for i, (h, p) in enumerate(addrs)
            ]
            return BackendPool(role, backends, loop, cfg.breaker_failures, cfg.breaker_cooldown)

        self.prefillers = pool("prefill", cfg.prefillers)
        self.decoders = pool("decode", cfg.decoders)
        pools = [self.prefillers, self.decoders]
        self.health = HealthChecker(pools, cfg.health_path, cfg.health_interval, cfg.health_timeout)
        router = Router()
        limits = Limits(cfg.client_timeout, cfg.idle_timeout, cfg.max_connections,
                        cfg.max_connections_per_peer, cfg.max_body_bytes,
                        cfg.max_buffered_bytes)  # fmt: skip
        self.state = ServerState(router, loop, cfg.access_log, limits)
        steps = Steps(cfg, self.prefillers, self.decoders, metrics, loop)
        self.auth = BackendAuth(cfg.api_key, checks_clients=bool(cfg.client_key))
        self.capacity = install_routing(cfg, self.prefillers, self.decoders, steps,
                                        self.auth.fixed)  # fmt: skip
        self.limits = ModelLimits([self.decoders, self.prefillers], self.auth.fixed)
        self.flow = make_flow(
            cfg.flow, steps, metrics, self.state.spawn, cfg.prefill_timeout, cfg.metaserver,
            self.limits,
        )  # fmt: skip
        self.admin = Admin(pools, cfg.admin_token, cfg.drain_timeout, loop, self.auth.fixed)
        # The admin interface and the metaserver check their own credentials.
        own = self.admin.paths | {path.encode() for _, path, _ in self.flow.routes}
        self.state.gate = ClientGate(cfg.client_key, cfg.open_path_set, frozenset(own))
        gen = Generation(self.flow, self.auth, metrics, loop)
        for path, route in GENERATION_PATHS.items():
            router.add_async("POST", path, gen.handler(route))
        passing = PassThrough([self.decoders, self.prefillers], self.auth)
        for method, path in PASS_THROUGH:
            router.add_async(method, path, passing.handle)
        for method, path, handler in (*self.flow.routes, *self.admin.routes):
            router.add_async(method, path, handler)
        router.add_async("GET", "/v1/models", self.models)
        router.add("GET", "/health", self.health_endpoint)
        router.add("GET", "/healthcheck", self.healthcheck)
        router.add("GET", "/metrics", self.metrics_endpoint)
        engines = EngineMetrics([self.prefillers, self.decoders], self.auth)
        router.add_async("GET", "/metrics/engines", engines.handle)
        self.server: asyncio.Server | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.stopping = asyncio.Event()

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        self.server = await self.loop.create_server(
            lambda: ClientConnection(self.state), self.cfg.host, self.cfg.port, backlog=4096
        )
        if self.cfg.port == 0 and isinstance(self.flow, Layerwise) and not self.cfg.metaserver_url:
            self.flow.set_metaserver(self.cfg.with_port(self.port).metaserver)
        self._tasks = [self.loop.create_task(self.health.run()),
                       self.loop.create_task(self.state.sweep()),
                       self.loop.create_task(self.limits.run())]  # fmt: skip
        if self.capacity is not None:  # each prefix index sized from its engine
            self._tasks.append(self.loop.create_task(self.capacity.run()))

    async def stop(self) -> None:
        """Stop listening; answer, within the grace period, every request in flight or still
        arriving on a connection accepted before (each connection then closes after its
        response); then close idle connections and cut what is left. A client sees either
        its answer or a refused connection, not one closed under its request."""
        pending: list[socket.socket] = []
        if self.server is not None:
            pending = take_backlog(self.server.sockets)
            self.server.close()
        self.state.closing = True
        for sock in pending:  # served as connections accepted before (their request is sent)
            try:
                await self.loop.connect_accepted_socket(lambda: ClientConnection(self.state), sock)
            except OSError:
                sock.close()
        for t in self._tasks:
            t.cancel()
        deadline = self.loop.time() + self.cfg.shutdown_grace
        while self.state.serving(self.loop.time()) and self.loop.time() < deadline:
            await asyncio.sleep(0.02)
        for task in list(self.state.tasks):
            task.cancel()
        for conn in list(self.state.connections):
            conn.shut()
        self.prefillers.close()
        self.decoders.close()
        await asyncio.sleep(0)

    # --- small endpoints ---------------------------------------------------------------------
    def _ready(self) -> tuple[bool, bool]:
        return self.cfg.flow == "mixed" or self.prefillers.any_healthy(), (
            self.decoders.any_healthy()
        )

    def health_endpoint(self, client: ClientConnection, req: Request) -> None:
        p_ok, d_ok = self._ready()
        if p_ok and d_ok:
            client.send_json(200, b'{"status":"ok"}')
            return
        missing = [r for r, ok in (("prefiller", p_ok), ("decoder", d_ok)) if not ok]
        client.send_json(
            503,
            json.dumps({"status": "unavailable", "no_healthy": missing}).encode(),
        )

    def healthcheck(self, client: ClientConnection, req: Request) -> None:
        ready = all(self._ready())
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
            self.metrics.render(self.prefillers, self.decoders, self.state),
            b"text/plain; version=0.0.4; charset=utf-8",
        )

    async def models(self, client: ClientConnection, req: Request) -> None:
        """GET /v1/models from a healthy decoder (then any prefiller)."""
        extra = self.auth.header(req)
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


def raise_open_files(max_connections: int) -> tuple[int, int]:
    """Raise the soft open-files limit to the hard one and say if that still cannot hold the
    configured concurrency (each stream holds a client and a backend connection)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            log.info("open-files limit raised from %d to %d", soft, target)
            soft = target
        except (ValueError, OSError) as e:
            log.warning("could not raise the open-files limit from %d: %s", soft, e)
    need = 2 * max_connections + 64
    if soft < need:
        log.warning(
            "the open-files limit (%d) holds about %d streams, below --max-connections %d "
            "(each stream needs a client and a backend connection): raise the hard limit "
            "(ulimit -Hn / LimitNOFILE=) or lower --max-connections",
            soft, (soft - 64) // 2, max_connections,
        )  # fmt: skip
    return soft, need


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
        "kvpd proxy (%s) listening on %s:%d; %s; clients: %s; admin: %s",
        cfg.flow,
        cfg.host,
        app.port,
        " ".join(f"{b.name}={b.pool.address}"
                 for b in app.prefillers.backends + app.decoders.backends),
        "client key required" if cfg.client_key else "no client key (open)",
        "token required" if cfg.admin_token else "off (no token)",
    )  # fmt: skip
    await app.stopping.wait()
    log.info("stopping")
    await app.stop()


def run(cfg: ProxyConfig) -> None:
    logging.basicConfig(
        level=getattr(logging, cfg.log_level, logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    raise_open_files(cfg.max_connections)
    _install_loop()
    asyncio.run(serve(cfg))


def run_from_argv(argv: list[str]) -> None:
    run(parse_args(argv))
