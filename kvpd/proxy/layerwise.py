"""The decode-first layerwise flow (vLLM-Ascend's metaserver flow): the decoder gets the request
first and calls POST /v1/metaserver with its KV destination; that call dispatches the prefill
and is answered only when the prefill is done.

Only the decoder of a request may report it to the metaserver: the URL the proxy gives it in
kv_transfer_params carries a token made for that request (`?token=...`), and a report without
the request's token is refused 403. The token travels only from the proxy to that decoder,
inside the body the proxy encodes; even if it came back to the client, it would open no other
request."""

from __future__ import annotations

import asyncio
import hmac
import secrets
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from kvpd.proxy.apis import GENERATION_PATHS, LIMIT_FIELDS, is_chat
from kvpd.proxy.relay import DecodeRelay, Failure, error_body
from kvpd.proxy.rewrite import (
    child_request_ids,
    decode_tokens,
    encode,
    estimate_prompt_tokens,
    parse_body,
    prefill_request_body,
)
from kvpd.proxy.usage import CachedTokens, prefill_cached_tokens

if TYPE_CHECKING:
    from kvpd.proxy.metrics import ProxyMetrics
    from kvpd.proxy.routing import AsyncHandler, GenerationCall, Request
    from kvpd.proxy.server import ClientConnection
    from kvpd.proxy.steps import Steps


class LayerwiseRecord:
    """A decode-first request waiting for its decoder to call /v1/metaserver."""

    __slots__ = ("request_id", "path", "body", "children", "params", "done", "dispatched",
                 "relay", "extra", "tokens", "token")  # fmt: skip

    def __init__(
        self,
        request_id: str,
        path: bytes,
        body: dict[str, Any],
        children: list[str],
        extra: bytes,
        tokens: int,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.request_id = request_id
        self.path = path
        self.body = body
        self.children = children
        self.extra = extra
        self.tokens = tokens
        self.params: dict[str, dict[str, Any]] = {}
        self.done: asyncio.Future[Failure | None] = loop.create_future()
        self.dispatched = False
        self.relay: DecodeRelay | None = None
        self.token = secrets.token_urlsafe(18)  # the metaserver URL's, for this request only


class Layerwise:
    """The flow, and the records of decode-first requests by the ids their decoder will
    report. `spawn` runs the prefill as a task the server waits for on shutdown."""

    def __init__(
        self,
        steps: Steps,
        metrics: ProxyMetrics,
        spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Task[Any]],
        prefill_timeout: float,
        metaserver_url: str,
    ) -> None:
        self.steps = steps
        self.loop = steps.loop
        self.metrics = metrics
        self.spawn = spawn
        self.prefill_timeout = prefill_timeout
        self.records: dict[str, LayerwiseRecord] = {}
        self.set_metaserver(metaserver_url)
        self.routes: tuple[tuple[str, str, AsyncHandler], ...] = (
            ("POST", "/v1/metaserver", self.metaserver),
        )

    def id_in_use(self, request_id: str) -> bool:
        """The metaserver finds a request by the ids its decoder reports, which derive from
        the request id: two requests in flight must not share one."""
        return any(record.request_id == request_id for record in self.records.values())

    def set_metaserver(self, url: str) -> None:
        self._meta_url = url + ("&" if "?" in url else "?") + "token="

    def _meta_kv(self, record: LayerwiseRecord) -> dict[str, Any]:
        url = self._meta_url + record.token
        return {"do_remote_decode": False, "do_remote_prefill": True, "metaserver": url}

    async def handle(self, call: GenerationCall) -> None:
        client, req, body, request_id, extra = (
            call.client, call.req, call.body, call.request_id, call.extra
        )  # fmt: skip
        prompt_tokens = estimate_prompt_tokens(body)
        if call.route == "responses":
            # vLLM names a Responses API request after its body's request_id, not the header
            rid = request_id if body.get("request_id") == request_id else f"resp_{request_id}"
            body = dict(body, request_id=rid)
            children = [rid]
        else:
            children = child_request_ids(request_id, is_chat(call.route, body), body)
        record = LayerwiseRecord(
            request_id, req.path, body, children, extra, prompt_tokens, self.loop
        )
        d_data = encode(dict(body, kv_transfer_params=self._meta_kv(record)))
        for child in children:
            self.records[child] = record

        def on_attempt(relay: DecodeRelay, attempt: int) -> None:
            if attempt:
                self._reset(record)
            record.relay = relay

        try:
            await self.steps.decode(
                client,
                req,
                d_data,
                decode_tokens(body, prompt_tokens),
                extra,
                request_id,
                on_attempt,
                self.steps.keys(body),  # used only with --decode-affinity
            )
        finally:
            for child in children:
                self.records.pop(child, None)
            if not record.done.done():
                record.done.set_result(Failure(404, "metaserver_unknown", "request finished"))

    def _reset(self, record: LayerwiseRecord) -> None:
        """A retried decode calls the metaserver again: give it a fresh prefill (otherwise it
        would get the old "ok" and wait for KV that was sent elsewhere)."""
        if not record.done.done():
            record.done.set_result(Failure(502, "decode_error", "decode attempt abandoned"))
        record.done = self.loop.create_future()
        record.params = {}
        record.dispatched = False

    async def metaserver(self, client: ClientConnection, req: Request) -> None:
        """POST /v1/metaserver from a decoder: dispatch the prefill once every child id has
        reported, and answer only when it is done."""
        given = _token_of(req.query)
        if not given:
            self._forbid(client)
            return
        try:
            payload = parse_body(req.body)
            child = str(payload["request_id"])
        except (Failure, KeyError):
            client.send_json(400, error_body("expected JSON with request_id", "bad_request", 400))
            return
        record = self.records.get(child)
        if record is None and len(child) > 9:
            # vLLM may report its internal id: the external one plus a 9-character suffix.
            child = child[:-9]
            record = self.records.get(child)
        if record is None:
            self.metrics.failures["metaserver_unknown"] += 1
            client.send_json(
                404, error_body(f"unknown request id {payload['request_id']}", "not_found", 404)
            )
            return
        if not hmac.compare_digest(given, record.token.encode()):
            self._forbid(client)
            return
        record.params[child] = payload
        done = record.done
        if not record.dispatched and len(record.params) >= len(record.children):
            record.dispatched = True
            self.spawn(self._prefill(record, done))
        try:
            failure = await asyncio.wait_for(asyncio.shield(done), self.prefill_timeout or None)
        except asyncio.TimeoutError:
            failure = Failure(504, "prefill_timeout", "prefill did not finish in time")
        if failure is None:
            client.send_json(200, b'{"status":"ok"}')
        else:
            client.send_json(failure.status if failure.status >= 500 else 502, failure.body)

    def _forbid(self, client: ClientConnection) -> None:
        self.metrics.failures["metaserver_forbidden"] += 1
        why = "the metaserver answers only a request's decoder (its URL's token)"
        client.send_json(403, error_body(why, "forbidden", 403))

    async def _prefill(self, record: LayerwiseRecord, done: asyncio.Future[Failure | None]) -> None:
        params = [record.params[c] for c in record.children]
        route = GENERATION_PATHS.get(record.path.decode(), "completions")
        p_body = prefill_request_body(record.body, dict(params[0]), LIMIT_FIELDS[route])
        if len(params) > 1:
            p_body["batch_kv_transfer_params"] = dict(zip(record.children, params, strict=True))
        relay = record.relay
        try:
            answer = await self.steps.prefill(
                record.path, encode(p_body), record.tokens, record.extra,
                self.steps.keys(record.body),
            )  # fmt: skip
        except Failure as f:
            if not done.done():
                done.set_result(f)
            if relay is not None and record.done is done and not relay.sent:
                relay.abandon(f)  # the decoder would wait for this KV forever
            return
        if relay is not None and record.done is done:
            # the decoder counts the KV it receives as cached: clients get the prefill's hits.
            # Set before the metaserver answers: the decoder computes nothing until then.
            relay.usage = CachedTokens(prefill_cached_tokens(answer))
        self.metrics.disaggregated += 1
        if not done.done():
            done.set_result(None)


def _token_of(query: bytes) -> bytes:
    for part in query.split(b"&"):
        if part.startswith(b"token="):
            return part[6:]
    return b""
