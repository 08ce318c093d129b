"""The vLLM APIs beyond completions and chat through the proxy, against stand-in backends:
generation APIs run the P/D flow with their own output-limit fields; the others are passed to
a healthy engine; the client's request id and trace context reach both engines."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest

from kvpd.proxy.apis import GENERATION_PATHS, PASS_THROUGH
from kvpd.proxy.usage import CachedTokens, prefill_cached_tokens
from tests.unit.proxy_cluster import PREFILL_KV, Cluster, run_cluster

pytestmark = pytest.mark.timeout(30)

RESPONSES = {"model": "fake", "input": "Hello there", "max_output_tokens": 8, "stream": True}
MESSAGES = {
    "model": "fake",
    "max_tokens": 8,
    "system": "Be brief.",
    "messages": [{"role": "user", "content": "Hi!"}],
}


def _legs(c: Cluster) -> tuple[tuple[str, dict[bytes, bytes], dict[str, Any]], ...]:
    ((p,), (d,)) = c.p[0].requests, c.d[0].requests
    return p, d


@pytest.mark.parametrize(
    ("path", "body", "limit"),
    [
        ("/v1/responses", RESPONSES, "max_output_tokens"),
        ("/v1/messages", MESSAGES, "max_tokens"),
        ("/invocations", {"model": "fake", "messages": [{"role": "user", "content": "x"}]},
         "max_tokens"),
        ("/invocations", {"model": "fake", "prompt": "x", "max_tokens": 8}, "max_tokens"),
    ],
)  # fmt: skip
def test_generation_apis_run_the_prefill_first_flow(
    path: str, body: dict[str, Any], limit: str
) -> None:
    async def t(c: Cluster) -> None:
        r = await c.call("POST", path, body)
        assert r.status == 200
        assert r.complete
        (p_path, p_headers, p_body), (d_path, d_headers, d_body) = _legs(c)
        assert p_path == d_path == path
        assert p_body[limit] == 1
        assert p_body["stream"] is False
        assert p_body["kv_transfer_params"] == PREFILL_KV
        if limit == "max_output_tokens":  # Responses API: no chat-style field, never stored
            assert "max_tokens" not in p_body
            assert p_body["store"] is False
        assert d_body == dict(body, kv_transfer_params=d_body["kv_transfer_params"])
        assert d_body["kv_transfer_params"]["do_remote_prefill"] is True
        assert p_headers[b"x-request-id"] == d_headers[b"x-request-id"]
        route = GENERATION_PATHS[path]
        assert c.metric(f'kvpd_proxy_requests_total{{route="{route}"}}') == 1
        assert c.metric("kvpd_proxy_disaggregated_requests_total") == 1

    run_cluster(t)


def test_responses_streaming_relays_the_decoders_events() -> None:
    async def t(c: Cluster) -> None:
        r = await c.call("POST", "/v1/responses", RESPONSES)
        assert r.status == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.events()[-1] == "[DONE]"
        assert len(r.events()) == 5

    run_cluster(t)


@pytest.mark.parametrize(("method", "path"), PASS_THROUGH)
def test_other_apis_pass_to_a_healthy_engine(method: str, path: str) -> None:
    async def t(c: Cluster) -> None:
        body = {"model": "fake", "prompt": "Hi"} if method == "POST" else None
        r = await c.call(method, path + "?x=1", body)
        assert r.status == 200
        if path in ("/tokenize", "/detokenize"):
            assert r.json() == {"path": path, "query": "x=1", "body": body}
            ((_, headers, _),) = c.d[0].requests  # a decoder first
            assert b"x-request-id" not in headers
        elif path != "/ping":
            assert r.json() == {"version": "stand-in", "role": "decode"}
        assert not c.p[0].requests

    run_cluster(t)


def test_pass_through_relays_engine_errors_and_falls_back_to_prefillers() -> None:
    async def t(c: Cluster) -> None:
        r = await c.call("POST", "/tokenize", {"model": "fake", "prompt": ""})
        assert r.status == 400
        assert r.json()["error"]["type"] == "BadRequestError"
        c.app.decoders.backends[0].draining = True
        r = await c.call("GET", "/version")
        assert r.status == 200
        assert r.json()["role"] == "prefill"

    run_cluster(t)


def test_pass_through_refuses_a_bad_body() -> None:
    async def t(c: Cluster) -> None:
        r = await c.call("POST", "/tokenize", [1, 2])
        assert r.status == 400
        assert "object" in r.json()["error"]["message"]
        assert not c.d[0].requests

    run_cluster(t)


# --- request ids and trace context -----------------------------------------------------------
TRACE = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_the_clients_request_id_header_reaches_both_engines_with_trace_context() -> None:
    async def t(c: Cluster) -> None:
        headers = {"X-Request-Id": "my-id-1", "traceparent": TRACE, "tracestate": "a=1",
                   "X-Other": "no"}  # fmt: skip
        r = await c.call(
            "POST", "/v1/completions", {"prompt": "x", "max_tokens": 2}, headers=headers
        )
        assert r.status == 200
        assert r.headers["x-request-id"] == "my-id-1"
        for _, h, _ in _legs(c):
            assert h[b"x-request-id"] == b"my-id-1"
            assert h[b"traceparent"] == TRACE.encode()
            assert h[b"tracestate"] == b"a=1"
            assert b"x-other" not in h

    run_cluster(t)


def test_the_body_request_id_is_sent_as_the_header() -> None:
    async def t(c: Cluster) -> None:
        body = {"messages": [{"role": "user", "content": "x"}], "request_id": "body-id"}
        r = await c.call("POST", "/v1/chat/completions", body)
        assert r.status == 200
        for _, h, b in _legs(c):
            assert h[b"x-request-id"] == b"body-id"
            assert b["request_id"] == "body-id"

    run_cluster(t)


def test_an_id_that_cannot_be_a_header_gets_the_proxys_own(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def t(c: Cluster) -> None:
        body = {"prompt": "x", "request_id": "two words\r\nX-Evil: 1"}
        r = await c.call("POST", "/v1/completions", body)
        assert r.status == 200
        for _, h, _ in _legs(c):
            assert len(h[b"x-request-id"]) == 32
            assert b"x-evil" not in h
        rid = r.headers["x-request-id"]
        assert f"is served as {rid} (not a header value)" in caplog.text

    with caplog.at_level(logging.INFO, logger="kvpd.proxy"):
        run_cluster(t)


@pytest.mark.parametrize("path", ["/v1/responses", "/v1/messages", "/invocations"])
def test_layerwise_serves_the_generation_apis(path: str) -> None:
    async def t(c: Cluster) -> None:
        body = RESPONSES if path == "/v1/responses" else MESSAGES
        r = await c.call("POST", path, body, headers={"X-Request-Id": "lw-1"})
        assert r.status == 200
        assert r.complete
        assert c.d[0].metaserver_answers == [200]
        (_, _, p_body), (_, _, d_body) = _legs(c)
        limit = "max_output_tokens" if path == "/v1/responses" else "max_tokens"
        assert p_body[limit] == 1
        assert d_body[limit] == 8
        if path == "/v1/responses":
            assert d_body["request_id"] == "resp_lw-1"

    run_cluster(t, flow="layerwise")


def test_layerwise_gives_a_second_request_with_an_id_in_flight_its_own() -> None:
    async def t(c: Cluster) -> None:
        c.d[0].delay_s = 0.2
        body = {"prompt": "x", "max_tokens": 2}
        replies = await asyncio.gather(
            *(c.call("POST", "/v1/completions", body, headers={"X-Request-Id": "same"})
              for _ in range(2))
        )  # fmt: skip
        assert [r.status for r in replies] == [200, 200]
        ids = sorted(h[b"x-request-id"] for _, h, _ in c.d[0].requests)
        assert ids[1] == b"same"
        assert len(ids[0]) == 32

    run_cluster(t, flow="layerwise")


# --- usage -----------------------------------------------------------------------------------
@pytest.mark.parametrize("flow", ["prefill-first", "layerwise"])
@pytest.mark.parametrize("stream", [False, True])
def test_clients_see_the_prefills_cache_hits_as_cached_tokens(stream: bool, flow: str) -> None:
    """In both P/D flows: prefill first, and decode first (the prefill runs while the decoder
    waits in its metaserver call, so its hits are known before the decoder answers)."""

    async def t(c: Cluster) -> None:
        c.p[0].cached_tokens = 32  # prefix-cache hits at the prefill
        c.d[0].cached_tokens = 288  # the decoder counts the KV it received
        body = {"prompt": "x", "max_tokens": 4, "stream": stream}
        r = await c.call("POST", "/v1/completions", body)
        assert r.status == 200
        assert r.complete
        usage = json.loads(r.events()[-2])["usage"] if stream else r.json()["usage"]
        assert usage["prompt_tokens_details"] == {"cached_tokens": 32}
        assert c.metric("kvpd_proxy_kv_handoff_tokens_total") == 256

    run_cluster(t, flow=flow)


def test_cached_tokens_without_details_stay_absent() -> None:
    async def t(c: Cluster) -> None:
        r = await c.call("POST", "/v1/completions", {"prompt": "x"})
        assert r.status == 200
        assert "prompt_tokens_details" not in r.json()["usage"]
        assert c.metric("kvpd_proxy_kv_handoff_tokens_total") == 0

    run_cluster(t)


def test_cached_figures_are_rewritten_in_place() -> None:
    patch = CachedTokens(7).patch
    assert patch(b'{"cached_tokens":288}') == b'{"cached_tokens":  7}'
    assert patch(b'{"cache_read_input_tokens": 12}') == b'{"cache_read_input_tokens":  7}'
    assert patch(b'{"text":"\\"cached_tokens\\":5"}') == b'{"text":"\\"cached_tokens\\":5"}'
    assert CachedTokens(1000).patch(b'{"cached_tokens":5}') == b'{"cached_tokens":5}'
    assert json.loads(patch(b'{"u":{"cached_tokens":99}}')) == {"u": {"cached_tokens": 7}}
    assert prefill_cached_tokens({"usage": {"input_tokens_details": {"cached_tokens": 3}}}) == 3
    assert prefill_cached_tokens({"usage": {"cache_read_input_tokens": 4}}) == 4
    assert prefill_cached_tokens({"usage": None}) == 0


# --- requests the decoder will refuse --------------------------------------------------------
@pytest.mark.parametrize(
    ("route", "change"),
    [("/v1/completions", {"max_tokens": "ten"}), ("/v1/completions", {"max_tokens": 100000}),
     ("/v1/completions", {"max_tokens": 512}), ("/v1/completions", {"max_tokens": -3}),
     ("/v1/chat/completions", {"max_completion_tokens": [1]}),
     ("/v1/responses", {"max_output_tokens": 4096}), ("/v1/messages", {"max_tokens": 1e9})],
)  # fmt: skip
def test_a_request_the_decoder_will_refuse_gets_no_prefill(
    route: str, change: dict[str, Any]
) -> None:
    async def t(c: Cluster) -> None:
        assert await c.app.limits.refresh()
        assert c.app.limits.max_model_len == {"stand-in": 512}
        body = {"model": "stand-in", "prompt": "x", "messages": [], "input": "x", **change}
        c.d[0].fail_status = 400  # as vLLM answers it
        r = await c.call("POST", route, body)
        assert r.status == 400
        assert r.json()["error"]["message"] == "stand-in decode failure"
        assert not c.p[0].requests
        ((_, _, d_body),) = c.d[0].requests
        assert d_body == body  # as sent, no KV parameters
        assert c.metric("kvpd_proxy_sent_without_prefill_total") == 1

    run_cluster(t)


@pytest.mark.parametrize(
    "change", [{"max_tokens": 511}, {"max_tokens": "12"}, {"max_tokens": None}, {"model": "x",
               "max_tokens": 9999}, {"max_tokens": 0}, {}]
)  # fmt: skip
def test_a_request_that_may_be_valid_gets_its_prefill(change: dict[str, Any]) -> None:
    async def t(c: Cluster) -> None:
        await c.app.limits.refresh()
        body = {"model": "stand-in", "prompt": "x", **change}
        r = await c.call("POST", "/v1/completions", body)
        assert r.status == 200
        assert len(c.p[0].requests) == 1

    run_cluster(t)


def test_without_a_known_length_nothing_is_decided_by_length() -> None:
    async def t(c: Cluster) -> None:
        await asyncio.sleep(0.1)  # the proxy's own first fetch is done
        c.app.limits.pools = []
        c.app.limits.max_model_len = {}
        r = await c.call("POST", "/v1/completions", {"prompt": "x", "max_tokens": 100000})
        assert r.status == 200
        assert len(c.p[0].requests) == 1

    run_cluster(t)
