"""The prefill-first P/D flow (prefill with max_tokens=1, then decode with the returned
kv_transfer_params) and the retrying prefill/decode steps the layerwise flow reuses."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kvpd.proxy.layerwise import Layerwise
from kvpd.proxy.relay import ClientGone, DecodeRelay, Failure
from kvpd.proxy.rewrite import (
    PREFILL_KV_PARAMS,
    decode_tokens,
    dumps,
    estimate_prompt_tokens,
    prefill_request_body,
)
from kvpd.proxy.upstream import ConnectionLost, ReadTimeout, UpstreamError, build_request, fetch

if TYPE_CHECKING:
    from kvpd.proxy.app import ProxyApp
    from kvpd.proxy.backends import Backend
    from kvpd.proxy.server import ClientConnection, Request

log = logging.getLogger("kvpd.proxy")


class Flows:
    """Request handling shared by both flows; `app` holds config, pools and metrics."""

    def __init__(self, app: ProxyApp) -> None:
        self.app = app
        self.cfg = app.cfg
        self.metrics = app.metrics
        self.loop = app.loop
        key = os.environ.get("OPENAI_API_KEY")
        self._auth = f"Authorization: Bearer {key}\r\n".encode() if key else b""
        self.layerwise = Layerwise(self)

    # --- entry points ------------------------------------------------------------------------
    async def completions(self, client: ClientConnection, req: Request) -> None:
        await self._generate(client, req, "completions")

    async def chat_completions(self, client: ClientConnection, req: Request) -> None:
        await self._generate(client, req, "chat_completions")

    async def _generate(self, client: ClientConnection, req: Request, route: str) -> None:
        m = self.metrics
        m.requests[route] += 1
        m.inflight += 1
        request_id = ""
        try:
            try:
                body = json.loads(req.body)
                if not isinstance(body, dict):
                    raise ValueError("the body must be a JSON object")
            except ValueError as e:
                raise Failure(400, "bad_request", f"invalid JSON body: {e}") from None
            request_id = os.urandom(16).hex()
            extra = self._headers(req, request_id)
            if self.cfg.flow == "layerwise":
                await self.layerwise.handle(client, req, body, route, request_id, extra)
            elif self.cfg.flow == "mixed":
                tokens = decode_tokens(body, estimate_prompt_tokens(body))
                await self.decode(client, req, req.body, tokens, extra, request_id, None)
            else:
                await self._prefill_first(client, req, body, request_id, extra)
        except Failure as f:
            m.failures[f.kind] += 1
            if f.status >= 500:
                log.warning("%s %s -> %d: %s", route, request_id, f.status, f)
            if not client.closed:
                m.responses[f.status] += 1
                client.send_json(f.status, f.body)
        finally:
            m.inflight -= 1
            m.request_seconds.observe(self.loop.time() - req.started)

    def auth_header(self, req: Request) -> bytes:
        """OPENAI_API_KEY as a bearer token if set, else the client's own Authorization."""
        if self._auth:
            return self._auth
        given = req.headers.get(b"authorization")
        return b"" if given is None else b"Authorization: " + given + b"\r\n"

    def _headers(self, req: Request, request_id: str) -> bytes:
        return b"X-Request-Id: " + request_id.encode() + b"\r\n" + self.auth_header(req)

    # --- prefill-first -----------------------------------------------------------------------
    async def _prefill_first(
        self,
        client: ClientConnection,
        req: Request,
        body: dict[str, Any],
        request_id: str,
        extra: bytes,
    ) -> None:
        prompt_tokens = estimate_prompt_tokens(body)
        p_body = prefill_request_body(body, dict(PREFILL_KV_PARAMS))
        answer = await self.prefill(req.path, dumps(p_body).encode(), prompt_tokens, extra)
        kv = answer.get("kv_transfer_params") if isinstance(answer, dict) else None
        if kv:
            body["kv_transfer_params"] = kv
            d_data = dumps(body).encode()
        else:
            # e.g. ExampleConnector: the KV travels through shared storage, nothing to forward.
            self.metrics.prefill_without_params += 1
            d_data = req.body
        ok = await self.decode(
            client, req, d_data, decode_tokens(body, prompt_tokens), extra, request_id, None
        )
        if kv and ok:
            self.metrics.disaggregated += 1

    async def prefill(self, path: bytes, data: bytes, tokens: int, extra: bytes) -> dict[str, Any]:
        """Run the prefill on some prefiller (retrying others on connection errors and 5xx);
        return its JSON answer or raise Failure."""
        cfg = self.cfg
        pool = self.app.prefillers
        started = self.loop.time()
        tried: tuple[Backend, ...] = ()
        problems: list[str] = []
        kind = "prefill_error"
        for attempt in range(cfg.max_retries + 1):
            backend = pool.pick(tried) or pool.pick()
            if backend is None:
                if not problems:
                    raise Failure(503, "no_prefiller", self._none_usable(pool))
                break
            if attempt:
                self.metrics.retries += 1
                await asyncio.sleep(cfg.retry_delay * 2 ** (attempt - 1))
            tried += (backend,)
            backend.begin(tokens)
            try:
                resp = await fetch(backend.pool, b"POST", path, data, cfg.prefill_timeout, extra)
            except UpstreamError as e:
                problems.append(str(e))
                if isinstance(e, ReadTimeout):
                    backend.errors += 1
                    backend.last_error = str(e)
                    kind = "prefill_timeout"
                    break  # another prefiller would likely be just as slow: fail now
                pool.mark_down(backend, str(e))
                continue
            finally:
                backend.end(tokens)
            if resp.status == 200:
                self.metrics.prefill_seconds.observe(self.loop.time() - started)
                try:
                    return json.loads(resp.body)
                except ValueError:
                    problems.append(f"{backend.name} answered 200 with a body that is not JSON")
                    break
            backend.errors += 1
            snippet = resp.body[:300].decode(errors="replace")
            backend.last_error = f"HTTP {resp.status}"
            if resp.status < 500:
                # The request itself is wrong (e.g. prompt too long): pass the answer on.
                raise Failure(resp.status, "prefill_rejected", snippet, resp.body)
            problems.append(f"{backend.name} answered HTTP {resp.status}: {snippet}")
        raise Failure(
            502,
            kind,
            "prefill failed, request not sent to a decoder: " + "; ".join(problems),
        )

    # --- decode ------------------------------------------------------------------------------
    async def decode(
        self,
        client: ClientConnection,
        req: Request,
        data: bytes,
        tokens: int,
        extra: bytes,
        request_id: str,
        on_attempt: Callable[[DecodeRelay, int], None] | None,
    ) -> bool:
        """Relay a decoder's response; retry another decoder while nothing was sent. True when
        a complete answer went out. `on_attempt(relay, n)` runs before each attempt."""
        cfg = self.cfg
        pool = self.app.decoders
        rid = request_id.encode()
        tried: tuple[Backend, ...] = ()
        problems: list[str] = []
        kind = "decode_error"
        for attempt in range(cfg.max_retries + 1):
            backend = pool.pick(tried) or pool.pick()
            if backend is None:
                if not problems:
                    raise Failure(503, "no_decoder", self._none_usable(pool))
                break
            if attempt:
                self.metrics.retries += 1
                await asyncio.sleep(cfg.retry_delay * 2 ** (attempt - 1))
            tried += (backend,)
            relay = DecodeRelay(client, rid, self.loop)
            if on_attempt is not None:
                on_attempt(relay, attempt)
            backend.begin(tokens)
            try:
                outcome = await self._relay_once(backend, relay, req.path, data, extra, client)
            finally:
                backend.end(tokens)
            if outcome is None:
                if relay.status < 400:
                    self.metrics.first_byte_seconds.observe(relay.first_byte_at - req.started)
                else:
                    backend.errors += 1
                    backend.last_error = f"HTTP {relay.status}"
                    self.metrics.failures["decode_rejected"] += 1
                self.metrics.responses[relay.status] += 1
                client.finish()
                return relay.status < 400
            if isinstance(outcome, ClientGone):
                self.metrics.failures["client_disconnect"] += 1
                return False
            if isinstance(outcome, Failure):  # the layerwise prefill behind it failed
                raise outcome
            if relay.sent:
                # Part of a 200 stream is out: the only honest signal left is a broken
                # connection (never a clean end that looks like a finished answer).
                backend.errors += 1
                backend.last_error = str(outcome)
                self.metrics.failures["stream_truncated"] += 1
                log.warning("decode stream from %s broke: %s", backend.name, outcome)
                client.abort()
                return False
            if isinstance(outcome, UpstreamError):
                problems.append(str(outcome))
                if isinstance(outcome, ReadTimeout):
                    backend.errors += 1
                    backend.last_error = str(outcome)
                    kind = "decode_timeout"
                    break
                pool.mark_down(backend, str(outcome))
                continue
            # a 5xx answer, buffered
            backend.errors += 1
            backend.last_error = f"HTTP {relay.status}"
            snippet = b"".join(relay.error_parts or ())[:300].decode(errors="replace")
            problems.append(f"{backend.name} answered HTTP {relay.status}: {snippet}")
        raise Failure(502 if kind == "decode_error" else 504, kind,
                      "decode failed: " + "; ".join(problems))  # fmt: skip

    async def _relay_once(
        self,
        backend: Backend,
        relay: DecodeRelay,
        path: bytes,
        data: bytes,
        extra: bytes,
        client: ClientConnection,
    ) -> Exception | None:
        pool = backend.pool
        request = build_request(b"POST", path, pool, data, extra)
        for attempt in range(2):
            try:
                conn = await (pool.acquire() if attempt == 0 else pool.connect())
            except UpstreamError as e:
                return e
            if client.closed:
                pool.release(conn)
                return ClientGone()
            relay.upstream = conn
            client.relay = conn
            client.on_lost = lambda: relay.abandon(ClientGone())
            conn.send(request, relay, self.cfg.read_timeout)
            outcome = await relay.future
            if isinstance(outcome, ConnectionLost) and outcome.stale and not attempt:
                relay.future = self.loop.create_future()
                continue
            return outcome
        return None

    def _none_usable(self, pool: Any) -> str:
        states = ", ".join(f"{b.name}: {b.last_error or 'down'}" for b in pool.backends)
        return f"no healthy {pool.role} backend ({states})"
