"""The generation entry points and the flows behind them. One flow object is chosen at start
(`make_flow`); the entry points parse and account for the request and hand it to that flow.

- prefill-first: prefill with max_tokens=1, then decode with the returned kv_transfer_params;
- mixed: straight to an engine that does both;
- layerwise (decode first, kvpd/proxy/layerwise.py).

Every flow sends backends only bodies the proxy encoded from the parsed client body, with the
proxy-reserved fields removed (kvpd.proxy.rewrite.client_body): never the client's raw bytes."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Protocol

from kvpd.proxy.apis import LIMIT_FIELDS, GenerationRoute, json_media_refusal
from kvpd.proxy.layerwise import Layerwise
from kvpd.proxy.relay import Failure
from kvpd.proxy.requestids import (
    backend_headers,
    client_request_id,
    log_replaced,
    new_request_id,
)
from kvpd.proxy.rewrite import (
    PREFILL_KV_PARAMS,
    client_body,
    decode_tokens,
    encode,
    estimate_prompt_tokens,
    prefill_request_body,
)
from kvpd.proxy.routing import GenerationCall
from kvpd.proxy.usage import CachedTokens, prefill_cached_tokens

if TYPE_CHECKING:
    from kvpd.proxy.limits import ModelLimits
    from kvpd.proxy.metrics import ProxyMetrics
    from kvpd.proxy.routing import AsyncHandler, Request
    from kvpd.proxy.server import ClientConnection
    from kvpd.proxy.steps import Steps

log = logging.getLogger("kvpd.proxy")


class Flow(Protocol):
    # extra routes the flow serves (the layerwise metaserver)
    routes: tuple[tuple[str, str, AsyncHandler], ...]

    async def handle(self, call: GenerationCall) -> None: ...

    def id_in_use(self, request_id: str) -> bool:
        """Whether a request with this id is in flight where ids must be unique."""
        ...


class PrefillFirst:
    routes: tuple[tuple[str, str, AsyncHandler], ...] = ()

    def id_in_use(self, request_id: str) -> bool:
        return False  # the engines make their internal ids unique

    def __init__(self, steps: Steps, metrics: ProxyMetrics, limits: ModelLimits | None) -> None:
        self.steps = steps
        self.metrics = metrics
        self.limits = limits

    async def handle(self, call: GenerationCall) -> None:
        client, req, body, extra = call.client, call.req, call.body, call.extra
        prompt_tokens = estimate_prompt_tokens(body)
        keys = self.steps.keys(body)  # before the rewrites below: the client's prompt
        if self.limits is not None and self.limits.refused(body, call.route):
            # the decoder answers its own 400 before any work: no prefill for it
            self.metrics.refused_before_prefill += 1
            tokens = decode_tokens(body, prompt_tokens)
            await self.steps.decode(
                client, req, encode(body), tokens, extra, call.request_id, keys=keys
            )
            return
        p_body = prefill_request_body(body, dict(PREFILL_KV_PARAMS), LIMIT_FIELDS[call.route])
        answer = await self.steps.prefill(req.path, encode(p_body), prompt_tokens, extra, keys)
        kv = answer.get("kv_transfer_params") if isinstance(answer, dict) else None
        if kv:
            d_data = encode(dict(body, kv_transfer_params=kv))
        else:
            # e.g. ExampleConnector: the KV travels through shared storage, nothing to forward.
            self.metrics.prefill_without_params += 1
            d_data = encode(body)
        tokens = decode_tokens(body, prompt_tokens)
        # the decoder counts the KV it receives as cached: clients get the prefill's hits
        # (with KV in shared storage too: kv_transfer_params or not)
        cached = CachedTokens(prefill_cached_tokens(answer))
        ok = await self.steps.decode(
            client, req, d_data, tokens, extra, call.request_id, keys=keys, cached=cached
        )
        if kv and ok:
            self.metrics.disaggregated += 1


class Mixed:
    routes: tuple[tuple[str, str, AsyncHandler], ...] = ()

    def id_in_use(self, request_id: str) -> bool:
        return False

    def __init__(self, steps: Steps) -> None:
        self.steps = steps

    async def handle(self, call: GenerationCall) -> None:
        tokens = decode_tokens(call.body, estimate_prompt_tokens(call.body))
        await self.steps.decode(
            call.client, call.req, encode(call.body), tokens, call.extra, call.request_id,
            keys=self.steps.keys(call.body),
        )  # fmt: skip


def make_flow(
    name: str,
    steps: Steps,
    metrics: ProxyMetrics,
    spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Task[Any]],
    prefill_timeout: float,
    metaserver_url: str,
    limits: ModelLimits | None = None,
) -> Flow:
    if name == "layerwise":
        return Layerwise(steps, metrics, spawn, prefill_timeout, metaserver_url)
    if name == "mixed":
        return Mixed(steps)
    return PrefillFirst(steps, metrics, limits)


class BackendAuth:
    """The Authorization header sent to backends. A proxy that checks a client key (the
    client gate ran before any handler) sends its backend key (OPENAI_API_KEY) or nothing:
    the client key is the proxy's credential, never the backends'. A proxy without a client
    key passes each client's own Authorization on (the engines' VLLM_API_KEY decides); the
    configuration refuses a backend key without a client key, which would serve anyone."""

    def __init__(self, api_key: str, checks_clients: bool) -> None:
        self._fixed = f"Authorization: Bearer {api_key}\r\n".encode() if api_key else b""
        self._pass_on = not checks_clients

    @property
    def fixed(self) -> bytes:
        """The backend key's header line (b"" without one), for the proxy's own calls."""
        return self._fixed

    def header(self, req: Request) -> bytes:
        if self._fixed or not self._pass_on:
            return self._fixed
        given = req.headers.get(b"authorization")
        return b"" if given is None else b"Authorization: " + given + b"\r\n"


class Generation:
    """The generation APIs (kvpd.proxy.apis.GENERATION_PATHS): parse, count, hand to the
    flow."""

    def __init__(
        self,
        flow: Flow,
        auth: BackendAuth,
        metrics: ProxyMetrics,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.flow = flow
        self.auth = auth
        self.metrics = metrics
        self.loop = loop

    def handler(self, route: GenerationRoute) -> AsyncHandler:
        # a partial, not a wrapping coroutine: one coroutine per request, not two
        return functools.partial(self._generate, route=route)

    async def _generate(
        self, client: ClientConnection, req: Request, route: GenerationRoute
    ) -> None:
        m = self.metrics
        m.requests[route] += 1
        m.inflight += 1
        request_id = ""
        try:
            refusal = json_media_refusal(req)
            if refusal is not None:
                raise Failure(400, "bad_request", "not application/json", refusal)
            body = client_body(req.body)
            request_id, given = client_request_id(req, body)
            if not request_id or self.flow.id_in_use(request_id):
                why = "already in flight" if request_id else "not a header value"
                request_id = new_request_id()
                if given:
                    log_replaced(given, request_id, why)
            extra = backend_headers(req, request_id) + self.auth.header(req)
            await self.flow.handle(GenerationCall(client, req, body, route, request_id, extra))
        except Failure as f:
            m.failures[f.kind] += 1
            if f.status >= 500:
                log.warning("%s %s -> %d: %s", route, request_id, f.status, f)
            if not client.closed:
                m.responses[f.status] += 1
                client.send_json(f.status, f.body)
        except asyncio.CancelledError:
            # the client went away before the answer started (its backend calls are dropped)
            m.failures["client_disconnect"] += 1
            raise
        finally:
            m.inflight -= 1
            m.request_seconds.observe(self.loop.time() - req.started)
