"""The two steps every flow is made of, with retries on other backends and the circuit
breaker's evidence: prefill (buffered JSON) and decode (relayed to the client as it comes)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from kvpd.proxy.hostpool import build_request, fetch
from kvpd.proxy.relay import ClientGone, DecodeRelay, Failure
from kvpd.proxy.rewrite import as_text
from kvpd.proxy.upstream import ConnectFailed, ConnectionLost, ReadTimeout, UpstreamError

if TYPE_CHECKING:
    from kvpd.proxy.backends import Backend, BackendPool
    from kvpd.proxy.config import ProxyConfig
    from kvpd.proxy.metrics import ProxyMetrics
    from kvpd.proxy.routing import Request
    from kvpd.proxy.server import ClientConnection
    from kvpd.proxy.usage import CachedTokens

log = logging.getLogger("kvpd.proxy")


def _unreachable(e: UpstreamError) -> bool:
    """Refused, or reset before any byte: the process is likely gone (out until healthy)."""
    return isinstance(e, ConnectFailed) or (isinstance(e, ConnectionLost) and e.bytes_received == 0)


class Steps:
    def __init__(
        self,
        cfg: ProxyConfig,
        prefillers: BackendPool,
        decoders: BackendPool,
        metrics: ProxyMetrics,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.cfg = cfg
        self.prefillers = prefillers
        self.decoders = decoders
        self.metrics = metrics
        self.loop = loop
        # A request body's prompt-prefix keys for the pools that route by cache (set by the
        # app, kvpd/proxy/cache_aware.py); by default none, and every choice is by load.
        self.keys: Callable[[dict[str, Any]], Sequence[int]] = _no_keys

    def _attempts(
        self, pool: BackendPool, keys: Sequence[int], none_kind: str, problems: list[str]
    ) -> Iterator[tuple[int, Backend]]:
        """The backends a step tries, in order, with the retry policy both steps share: up to
        1 + max_retries attempts, each on a backend not tried yet if there is one (the caller
        pauses before each retry: `_pause`). No usable backend at all is a 503 (`none_kind`);
        none left after failures (noted in `problems` by the caller) ends the attempts. A
        plain generator, not an async one: left early, it is closed at once, not by a task."""
        tried: tuple[Backend, ...] = ()
        for attempt in range(self.cfg.max_retries + 1):
            backend = pool.pick(tried, keys) or pool.pick((), keys)
            if backend is None:
                if not problems:
                    raise Failure(503, none_kind, _none_usable(pool))
                return
            if attempt:
                self.metrics.retries += 1
            tried += (backend,)
            yield attempt, backend

    async def _pause(self, attempt: int) -> None:
        """Before retry `attempt` (1, 2, ...): a pause that doubles with each."""
        await asyncio.sleep(self.cfg.retry_delay * 2 ** (attempt - 1))

    async def prefill(
        self, path: bytes, data: bytes, tokens: int, extra: bytes, keys: Sequence[int] = ()
    ) -> dict[str, Any]:
        """Run the prefill on some prefiller (retrying others on connection errors and 5xx);
        return its JSON answer or raise Failure. Nothing reaches the client before this
        returns, so a retry is always safe; a failure is never followed by a decode."""
        cfg = self.cfg
        pool = self.prefillers
        started = self.loop.time()
        problems: list[str] = []
        kind = "prefill_error"
        for attempt, backend in self._attempts(pool, keys, "no_prefiller", problems):
            if attempt:
                await self._pause(attempt)
            backend.begin(tokens)
            try:
                resp = await fetch(backend.pool, b"POST", path, data, cfg.prefill_timeout, extra)
            except UpstreamError as e:
                problems.append(str(e))
                pool.failed(backend, str(e), _unreachable(e))
                if isinstance(e, ReadTimeout):
                    kind = "prefill_timeout"
                    break  # another prefiller would likely be just as slow: fail now
                continue
            finally:
                backend.end(tokens)
            if resp.status == 200:
                try:
                    answer = json.loads(as_text(resp.body))
                except ValueError:
                    answer = None
                if not isinstance(answer, dict):  # the decode step reads kv_transfer_params
                    pool.failed(backend, "answered 200 with a body that is not a JSON object")
                    problems.append(
                        f"{backend.name} answered 200 with a body that is not a JSON object"
                    )
                    continue
                pool.succeeded(backend)
                self.metrics.prefill_seconds.observe(self.loop.time() - started)
                return answer
            snippet = resp.body[:300].decode(errors="replace")
            if resp.status < 500:
                # The request itself is wrong (e.g. prompt too long): pass the answer on.
                backend.errors += 1
                backend.last_error = f"HTTP {resp.status}"
                raise Failure(resp.status, "prefill_rejected", snippet, resp.body)
            _answered_5xx(pool, backend, f"HTTP {resp.status}")
            problems.append(f"{backend.name} answered HTTP {resp.status}: {snippet}")
        raise Failure(
            502,
            kind,
            "prefill failed, request not sent to a decoder: " + "; ".join(problems),
        )

    async def decode(
        self,
        client: ClientConnection,
        req: Request,
        data: bytes,
        tokens: int,
        extra: bytes,
        request_id: str,
        on_attempt: Callable[[DecodeRelay, int], None] | None = None,
        keys: Sequence[int] = (),
        cached: CachedTokens | None = None,
    ) -> bool:
        """Relay a decoder's response; retry another decoder while nothing was sent. True when
        a complete answer went out. `on_attempt(relay, n)` runs before each attempt."""
        pool = self.decoders
        rid = request_id.encode()
        problems: list[str] = []
        kind = "decode_error"
        for attempt, backend in self._attempts(pool, keys, "no_decoder", problems):
            if attempt:
                await self._pause(attempt)
            relay = DecodeRelay(client, rid, self.loop)
            relay.usage = cached
            if on_attempt is not None:
                on_attempt(relay, attempt)
            backend.begin(tokens)
            try:
                outcome = await self._relay_once(backend, relay, req.path, data, extra, client)
            finally:
                backend.end(tokens)
            if outcome is None:
                return self._answered(backend, relay, req, client)
            if isinstance(outcome, (ClientGone, Failure)) or relay.sent:
                return self._ended(backend, relay, outcome)
            if isinstance(outcome, UpstreamError):
                problems.append(str(outcome))
                pool.failed(backend, str(outcome), _unreachable(outcome))
                if isinstance(outcome, ReadTimeout):
                    kind = "decode_timeout"
                    break
                continue
            # a 5xx answer, buffered
            _answered_5xx(pool, backend, f"HTTP {relay.status}")
            snippet = b"".join(relay.error_parts or ())[:300].decode(errors="replace")
            problems.append(f"{backend.name} answered HTTP {relay.status}: {snippet}")
        raise Failure(502 if kind == "decode_error" else 504, kind,
                      "decode failed: " + "; ".join(problems))  # fmt: skip

    def _answered(
        self, backend: Backend, relay: DecodeRelay, req: Request, client: ClientConnection
    ) -> bool:
        """The decoder's whole answer went out: count it; True when it was a success."""
        if relay.status < 400:
            self.decoders.succeeded(backend)
            if relay.usage is not None:  # set by the caller, or by a layerwise prefill
                self.metrics.kv_handoff_tokens += relay.usage.handoff
            self.metrics.first_byte_seconds.observe(relay.first_byte_at - req.started)
        else:
            backend.errors += 1
            backend.last_error = f"HTTP {relay.status}"
            self.metrics.failures["decode_rejected"] += 1
        self.metrics.responses[relay.status] += 1
        client.finish()
        return relay.status < 400

    def _ended(self, backend: Backend, relay: DecodeRelay, outcome: Exception) -> bool:
        """No retry: the client is gone, the layerwise prefill behind the decode failed
        (raised), or part of a 200 answer is out. Then the answer ends with an error the
        client can see (an SSE error event where the framing allows) and the connection
        closes: never a clean end."""
        if isinstance(outcome, ClientGone):
            self.metrics.failures["client_disconnect"] += 1
            return False
        if isinstance(outcome, Failure):
            raise outcome
        self.decoders.failed(backend, str(outcome))
        self.metrics.failures["stream_truncated"] += 1
        log.warning("decode stream from %s broke: %s", backend.name, outcome)
        relay.break_stream(f"the decoder's stream broke: {outcome}")
        return False

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
            client.relay_from(conn, lambda: relay.abandon(ClientGone()))
            conn.send(
                request, relay, self.cfg.read_timeout, first_timeout=self.cfg.first_byte_timeout
            )
            outcome = await relay.future
            if isinstance(outcome, ConnectionLost) and outcome.stale and not attempt:
                relay.future = self.loop.create_future()
                continue
            return outcome
        return None


def _no_keys(body: dict[str, Any]) -> Sequence[int]:
    return ()


def _answered_5xx(pool: BackendPool, backend: Backend, reason: str) -> None:
    """A backend answered 5xx. With others in its pool that is evidence for its circuit
    breaker (requests go elsewhere meanwhile). The only backend of its role keeps its circuit
    closed: opening it would answer every client 503 for the cooldown with nowhere else to
    go, and a 5xx can be one request's (a client retrying one such request three times would
    take the deployment down). An engine that is really gone fails its health check, which
    takes it out either way."""
    if len(pool.backends) > 1:
        pool.failed(backend, reason)
    else:
        backend.errors += 1
        backend.last_error = reason


def _none_usable(pool: BackendPool) -> str:
    states = ", ".join(
        f"{b.name}: {'draining' if b.draining else b.last_error or b.circuit}"
        for b in pool.backends
    )
    return f"no usable {pool.role} backend ({states})"
