"""The kvpd proxy end to end against stand-in backends on 127.0.0.1: both flows, streaming and not,
errors, balancing, health checks and metrics."""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import pytest

from tests.unit.proxy_cluster import (
    CHAT,
    CLIENT_AUTH,
    CLIENT_KEY,
    COMPLETION,
    PREFILL_KV,
    Cluster,
    run_cluster,
)

pytestmark = pytest.mark.timeout(30)


def raw_completion(*headers: bytes) -> bytes:
    """COMPLETION as one raw HTTP/1.1 request, with `headers` (lines) after Host."""
    body = json.dumps(COMPLETION).encode()
    extra = b"".join(h + b"\r\n" for h in headers)
    return (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + extra
        + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    )  # fmt: skip


# --- prefill-first ---------------------------------------------------------------------------


def test_prefill_first_streaming_completion_forwards_kv_params() -> None:
    async def t(c: Cluster) -> None:
        r = await c.call("POST", "/v1/completions", COMPLETION)
        assert r.status == 200
        assert r.complete
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.events() == [*(json.dumps(
            {"id": "cmpl-fake", "object": "text_completion",
             "choices": [{"index": 0, "text": f"t{i}"}]}) for i in range(4)), "[DONE]"]  # fmt: skip

        ((p_path, p_headers, p_body),) = c.p[0].requests
        assert p_path == "/v1/completions"
        assert p_body["max_tokens"] == 1
        assert p_body["stream"] is False
        assert "stream_options" not in p_body
        assert "min_tokens" not in p_body
        assert p_body["kv_transfer_params"] == PREFILL_KV
        assert p_body["prompt"] == COMPLETION["prompt"]

        ((_, d_headers, d_body),) = c.d[0].requests
        expected = dict(COMPLETION)
        expected["kv_transfer_params"] = {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_engine_id": f"fake-{c.p[0].port}",
            "remote_block_ids": [[1, 2, 3]],
            "remote_request_id": p_headers[b"x-request-id"].decode(),
            "remote_host": "127.0.0.1",
            "remote_port": c.p[0].port,
        }
        assert d_body == expected  # the original request, untouched except the KV params
        assert p_headers[b"x-request-id"] == d_headers[b"x-request-id"]
        assert r.headers["x-request-id"] == d_headers[b"x-request-id"].decode()
        assert c.metric("kvpd_proxy_disaggregated_requests_total") == 1
        assert c.metric('kvpd_proxy_requests_total{route="completions"}') == 1

    run_cluster(t)


def test_prefill_first_chat_non_streaming() -> None:
    async def t(c: Cluster) -> None:
        r = await c.call("POST", "/v1/chat/completions", CHAT)
        assert r.status == 200
        assert r.complete
        assert r.json()["choices"][0]["message"]["content"] == "t0t1t2t3"
        ((p_path, _, p_body),) = c.p[0].requests
        assert p_path == "/v1/chat/completions"
        assert p_body["max_completion_tokens"] == 1
        assert p_body["max_tokens"] == 1
        ((d_path, _, d_body),) = c.d[0].requests
        assert d_path == "/v1/chat/completions"
        assert d_body["max_completion_tokens"] == 8
        assert d_body["kv_transfer_params"]["do_remote_prefill"] is True
        assert c.metric('kvpd_proxy_requests_total{route="chat_completions"}') == 1

    run_cluster(t)


def test_chat_streaming_and_keep_alive_pipelining() -> None:
    async def t(c: Cluster) -> None:
        body = json.dumps(dict(CHAT, stream=True)).encode()
        req = (
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        reader, writer = await asyncio.open_connection("127.0.0.1", c.port)
        writer.write(req + req)  # two requests on one keep-alive connection, pipelined
        seen = b""
        end = b"data: [DONE]\n\n\r\n0\r\n\r\n"  # (a head can end in "0\r\n\r\n" too)
        while seen.count(end) < 2:
            seen += await reader.read(65536)
        writer.close()
        assert seen.count(b"HTTP/1.1 200 OK") == 2
        assert seen.count(b"chat.completion.chunk") == 8
        assert len(c.d[0].requests) == 2

    run_cluster(t)


def test_authorization_from_openai_api_key() -> None:
    """The backend key goes to the backends only for clients with the client key; the client
    key itself never reaches a backend."""

    async def t(c: Cluster) -> None:
        r = await c.call("POST", "/v1/completions", COMPLETION, headers=CLIENT_AUTH)
        assert r.status == 200
        assert c.p[0].requests[0][1][b"authorization"] == b"Bearer sk-test"
        assert c.d[0].requests[0][1][b"authorization"] == b"Bearer sk-test"
        assert CLIENT_KEY.encode() not in repr(c.p[0].requests + c.d[0].requests).encode()

    run_cluster(t, api_key="sk-test", client_key=CLIENT_KEY)


def test_client_authorization_forwarded_without_key() -> None:
    async def t(c: Cluster) -> None:
        await c.call("POST", "/v1/completions", COMPLETION, headers={"Authorization": "Bearer u"})
        assert c.p[0].requests[0][1][b"authorization"] == b"Bearer u"
        assert c.d[0].requests[0][1][b"authorization"] == b"Bearer u"

    run_cluster(t)


def test_prefill_without_kv_params_sends_original_body() -> None:
    """ExampleConnector-style prefillers return no kv_transfer_params: decode gets the request
    as the client sent it, and the request is not counted as disaggregated."""

    async def t(c: Cluster) -> None:
        c.p[0]._prefill_answer = lambda client, req, body: client.send_json(200, b'{"id":"x"}')
        r = await c.call("POST", "/v1/completions", COMPLETION)
        assert r.status == 200
        assert c.d[0].requests[0][2] == COMPLETION
        assert c.metric("kvpd_proxy_disaggregated_requests_total") == 0
        assert c.metric("kvpd_proxy_prefill_without_kv_params_total") == 1

    run_cluster(t)


def test_failed_prefill_is_502_and_never_decoded() -> None:
    async def t(c: Cluster) -> None:
        c.p[0].fail_status = 500
        r = await c.call("POST", "/v1/completions", COMPLETION)
        assert r.status == 502
        err = r.json()["error"]
        assert err["type"] == "prefill_error"
        assert "prefill failed" in err["message"]
        assert "prefill-0 answered HTTP 500" in err["message"]
        assert str(c.p[0].port) not in err["message"]  # no backend address reaches clients
        assert "HTTP 500" in err["message"]
        assert c.d[0].requests == []  # no silent decode-only fallback
        assert len(c.p[0].requests) == 1 + 2  # first try plus --max-retries 2
        assert c.metric('kvpd_proxy_failures_total{kind="prefill_error"}') == 1
        assert c.metric("kvpd_proxy_disaggregated_requests_total") == 0

    run_cluster(t, max_retries=2)


@pytest.mark.parametrize("body", [b"[1, 2]", b'"ok"', b"null", b"{not json"])
def test_prefill_200_without_a_json_object_is_a_prefill_failure(body: bytes) -> None:
    """A prefiller that says OK with a body that is not a JSON object has no kv_transfer_params
    to hand over: it counts as a failed prefill (retried, then 502), never as a proxy crash."""

    async def t(c: Cluster) -> None:
        c.p[0].body_200 = body
        r = await c.call("POST", "/v1/completions", COMPLETION)
        assert r.status == 502, r.body
        err = r.json()["error"]
        assert err["type"] == "prefill_error"
        assert "not a JSON object" in err["message"]
        assert c.d[0].requests == []
        assert len(c.p[0].requests) == 1 + 1  # first try plus --max-retries 1

    run_cluster(t, max_retries=1)


def test_prefill_client_error_is_passed_through() -> None:
    async def t(c: Cluster) -> None:
        c.p[0].fail_status = 400
        r = await c.call("POST", "/v1/completions", COMPLETION)
        assert r.status == 400
        assert r.json()["error"]["message"] == "stand-in prefill failure"
        assert len(c.p[0].requests) == 1
        assert c.d[0].requests == []

    run_cluster(t)


def test_dead_prefiller_fails_over_and_is_marked_down() -> None:
    async def t(c: Cluster) -> None:
        dead, alive = c.p
        await dead.stop()
        for _ in range(4):
            r = await c.call("POST", "/v1/completions", COMPLETION)
            assert r.status == 200
        assert len(alive.requests) == 4
        state = (await c.call("GET", "/healthcheck")).json()["prefill_instances"]
        by_name = {s["name"]: s for s in state}
        assert by_name["prefill-0"]["healthy"] is False
        assert "cannot connect" in by_name["prefill-0"]["last_error"]
        assert str(dead.port) not in json.dumps(state)
        assert c.metric("kvpd_proxy_retries_total") <= 1

    run_cluster(t, n_prefill=2)


def test_all_prefillers_dead_is_a_clear_error() -> None:
    async def t(c: Cluster) -> None:
        await c.p[0].stop()
        r = await c.call("POST", "/v1/completions", COMPLETION)
        assert r.status == 502
        assert "cannot connect" in r.json()["error"]["message"]
        r = await c.call("POST", "/v1/completions", COMPLETION)  # now known to be down
        assert r.status == 503
        assert r.json()["error"]["type"] == "no_prefiller"
        assert (await c.call("GET", "/health")).status == 503

    run_cluster(t)


def test_dead_decoder_gives_a_quick_clear_error() -> None:
    async def t(c: Cluster) -> None:
        await c.d[0].stop()
        r = await c.call("POST", "/v1/completions", COMPLETION)
        assert r.status == 502
        err = r.json()["error"]
        assert err["type"] == "decode_error"
        assert "decode failed" in err["message"]
        assert "decode-0" in err["message"]
        assert c.metric('kvpd_proxy_failures_total{kind="decode_error"}') == 1

    run_cluster(t)


def test_hung_decoder_times_out() -> None:
    """A decoder that never answers is bounded by --first-byte-timeout (no limit by default:
    in the layerwise flow the first byte waits for the whole prefill)."""

    async def t(c: Cluster) -> None:
        c.d[0].hang = True
        r = await c.call("POST", "/v1/completions", COMPLETION)
        assert r.status == 504
        assert r.json()["error"]["type"] == "decode_timeout"
        assert "sent nothing for 0.2 s" in r.json()["error"]["message"]

    run_cluster(t, first_byte_timeout=0.2, read_timeout=30.0)


def test_slow_first_byte_is_not_cut_by_the_read_timeout() -> None:
    """The read timeout bounds silence between stream chunks only: a decoder whose first byte
    takes longer than it (a long prefill ahead of it) is waited for."""

    async def t(c: Cluster) -> None:
        c.d[0].delay_s = 0.6
        r = await c.call("POST", "/v1/completions", COMPLETION)
        assert r.status == 200

    run_cluster(t, read_timeout=0.2)


@pytest.mark.parametrize("flow", ["prefill-first", "layerwise"])
def test_head_at_once_and_a_late_first_chunk_is_not_cut_by_the_read_timeout(flow: str) -> None:
    """vLLM sends a stream's head at once; in the layerwise flow its first chunk waits for the
    whole remote prefill (and its queue). The read timeout is the silence between body chunks
    only: the wait before the first body byte is bounded by --first-byte-timeout alone (0: none),
    so neither a 504 nor an open circuit comes of a long request."""

    async def t(c: Cluster) -> None:
        c.d[0].first_chunk_after_s = 0.8
        for _ in range(3):  # three in a row would open the circuit if they failed
            r = await c.call("POST", "/v1/completions", COMPLETION)
            assert r.status == 200, r.body
            assert r.complete, r.body
            assert r.events()[-1] == "[DONE]"
        assert c.metric('kvpd_proxy_failures_total{kind="decode_timeout"}') == 0

    run_cluster(t, flow=flow, read_timeout=0.2, breaker_failures=3)


def test_head_at_once_then_nothing_is_bounded_by_the_first_byte_timeout() -> None:
    async def t(c: Cluster) -> None:
        c.d[0].first_chunk_after_s = 5.0
        loop = asyncio.get_running_loop()
        started = loop.time()
        r = await c.call("POST", "/v1/completions", COMPLETION)
        assert loop.time() - started < 3.0  # 0.5 s first-byte limit, not the 30 s read limit
        assert "sent no response body for 0.5 s" in r.body.decode(), r.body

    run_cluster(t, first_byte_timeout=0.5, read_timeout=30.0, max_retries=0)


def test_hung_prefiller_times_out() -> None:
    async def t(c: Cluster) -> None:
        c.p[0].hang = True
        r = await c.call("POST", "/v1/completions", COMPLETION)
        assert r.status == 502
        assert r.json()["error"]["type"] == "prefill_timeout"
        assert c.d[0].requests == []

    run_cluster(t, prefill_timeout=0.2)


def test_decoder_5xx_is_retried_on_another_decoder() -> None:
    async def t(c: Cluster) -> None:
        c.d[0].fail_status = 503
        c.d[1].fail_status = None
        for _ in range(3):
            r = await c.call("POST", "/v1/completions", COMPLETION)
            assert r.status == 200
            assert r.complete
        assert len(c.d[1].requests) == 3

    run_cluster(t, n_decode=2)


def test_decoder_dying_mid_stream_breaks_the_client_connection() -> None:
    async def t(c: Cluster) -> None:
        c.d[0].chunk_gap_s = 0.05

        async def kill_soon() -> None:
            while not c.d[0].requests:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.12)
            await c.d[0].stop()

        killer = asyncio.ensure_future(kill_soon())
        r = await c.call("POST", "/v1/completions", COMPLETION)
        await killer
        assert r.status == 200
        assert not r.complete
        assert c.metric('kvpd_proxy_failures_total{kind="stream_truncated"}') == 1

    run_cluster(t)


def test_client_going_away_closes_the_decoder_stream() -> None:
    async def t(c: Cluster) -> None:
        dec = c.d[0]
        dec.chunk_gap_s = 0.05
        reader, writer = await asyncio.open_connection("127.0.0.1", c.port)
        writer.write(raw_completion())
        await reader.readuntil(b"data: ")
        writer.transport.abort()
        for _ in range(100):
            if not dec._state.connections:
                break
            await asyncio.sleep(0.01)
        assert not dec._state.connections  # the proxy dropped its decoder connection
        for _ in range(100):
            if c.metric('kvpd_proxy_failures_total{kind="client_disconnect"}') == 1:
                break
            await asyncio.sleep(0.01)
        assert c.metric('kvpd_proxy_failures_total{kind="client_disconnect"}') == 1

    run_cluster(t)


def test_bad_json_is_400() -> None:
    async def t(c: Cluster) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", c.port)
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 3\r\n"
                     b"Connection: close\r\n\r\n{x}")  # fmt: skip
        raw = await reader.read()
        assert raw.startswith(b"HTTP/1.1 400")
        assert b"invalid JSON" in raw
        assert c.p[0].requests == []

    run_cluster(t)


# --- balancing and health ----------------------------------------------------------------------
def test_balancing_spreads_sequential_requests() -> None:
    async def t(c: Cluster) -> None:
        for _ in range(6):
            assert (await c.call("POST", "/v1/completions", COMPLETION)).status == 200
        assert [len(b.requests) for b in c.p] == [2, 2, 2]
        assert [len(b.requests) for b in c.d] == [3, 3]

    run_cluster(t, n_prefill=3, n_decode=2)


def test_balancing_prefers_the_decoder_with_less_outstanding_work() -> None:
    async def t(c: Cluster) -> None:
        big = dict(COMPLETION, max_tokens=4000)
        small = dict(COMPLETION, max_tokens=4)
        first = asyncio.ensure_future(c.call("POST", "/v1/completions", big))
        while sum(len(d.requests) for d in c.d) < 1:
            await asyncio.sleep(0.005)
        busy = next(d for d in c.d if d.requests)
        others = [asyncio.ensure_future(c.call("POST", "/v1/completions", small))
                  for _ in range(3)]  # fmt: skip
        await asyncio.gather(first, *others)
        # 3 small requests (~4 + prompt tokens each) never outweigh the big one: they all go
        # to the other decoder while the big one is in flight.
        assert len(busy.requests) == 1

    run_cluster(t, n_decode=2, decode_delay=0.3)


def test_health_checks_remove_and_restore_backends() -> None:
    async def t(c: Cluster) -> None:
        sick = c.d[0]
        sick.healthy = False
        await c.app.health.wait_round()
        assert c.app.decoders.backends[0].healthy is False
        for _ in range(4):
            assert (await c.call("POST", "/v1/completions", COMPLETION)).status == 200
        assert sick.requests == []
        assert len(c.d[1].requests) == 4
        assert c.metric('kvpd_proxy_backend_healthy{role="decode",backend="decode-0"}') == 0

        c.d[1].healthy = False
        await c.app.health.wait_round()
        assert (await c.call("GET", "/health")).status == 503
        r = await c.call("POST", "/v1/completions", COMPLETION)
        assert r.status == 503
        assert r.json()["error"]["type"] == "no_decoder"

        sick.healthy = True
        c.d[1].healthy = True
        await c.app.health.wait_round()
        assert (await c.call("GET", "/health")).status == 200
        for _ in range(4):
            assert (await c.call("POST", "/v1/completions", COMPLETION)).status == 200
        assert len(sick.requests) == 2  # back in rotation

    run_cluster(t, n_decode=2, health_interval=0.05)


def test_health_endpoints_and_models() -> None:
    async def t(c: Cluster) -> None:
        r = await c.call("GET", "/health")
        assert r.status == 200
        assert r.json() == {"status": "ok"}
        hc = (await c.call("GET", "/healthcheck")).json()
        assert hc["status"] == "ok"
        assert hc["flow"] == "prefill-first"
        assert [i["healthy"] for i in hc["prefill_instances"] + hc["decode_instances"]] == [
            True,
            True,
        ]
        models = await c.call("GET", "/v1/models")
        assert models.status == 200
        assert models.json()["data"][0]["owned_by"] == "decode"
        assert (await c.call("GET", "/nope")).status == 404
        assert (await c.call("GET", "/v1/completions")).status == 405
        # the engines' prefix caches are the admin interface's (it fans out to every engine)
        assert (await c.call("POST", "/reset_prefix_cache")).status == 404
        admin = {"Authorization": "Bearer " + "t" * 32}
        assert (await c.call("POST", "/admin/reset_prefix_cache", headers=admin)).status == 200
        assert (await c.call("POST", "/admin/reset_prefix_cache")).status == 403

    run_cluster(t, admin_token="t" * 32)


def test_metrics_counters() -> None:
    async def t(c: Cluster) -> None:
        for _ in range(3):
            await c.call("POST", "/v1/completions", COMPLETION)
        await c.call("POST", "/v1/chat/completions", CHAT)
        c.p[0].fail_status = 500
        await c.call("POST", "/v1/completions", COMPLETION)
        r = await c.call("GET", "/metrics")
        assert r.status == 200
        assert r.headers["content-type"].startswith("text/plain")
        text = r.body.decode()
        assert 'kvpd_proxy_requests_total{route="completions"} 4' in text
        assert 'kvpd_proxy_requests_total{route="chat_completions"} 1' in text
        assert "kvpd_proxy_disaggregated_requests_total 4" in text
        assert 'kvpd_proxy_failures_total{kind="prefill_error"} 1' in text
        assert 'kvpd_proxy_responses_total{status="502"} 1' in text
        assert 'kvpd_proxy_backend_inflight{role="decode",backend="decode-0"} 0' in text
        assert str(c.d[0].port) not in text
        assert str(c.p[0].port) not in text
        assert "kvpd_proxy_request_seconds_count 5" in text
        assert 'kvpd_proxy_first_byte_seconds_bucket{le="+Inf"} 4' in text

    run_cluster(t, max_retries=0)


# --- decode-first layerwise --------------------------------------------------------------------
def test_layerwise_streaming_dispatches_prefill_from_metaserver() -> None:
    async def t(c: Cluster) -> None:
        r = await c.call("POST", "/v1/completions", COMPLETION)
        assert r.status == 200
        assert r.complete
        assert r.events()[-1] == "[DONE]"
        ((_, d_headers, d_body),) = c.d[0].requests
        rid = d_headers[b"x-request-id"].decode()
        assert d_body["kv_transfer_params"] == {
            "do_remote_decode": False,
            "do_remote_prefill": True,
            "metaserver": f"http://127.0.0.1:{c.port}/v1/metaserver?token={token(d_body)}",
        }
        assert d_body["stream"] is True
        assert d_body["max_tokens"] == 8
        ((_, p_headers, p_body),) = c.p[0].requests
        assert p_body["max_tokens"] == 1
        assert p_body["stream"] is False
        assert "min_tokens" not in p_body
        assert "stream_options" not in p_body
        kv = p_body["kv_transfer_params"]
        assert kv["request_id"] == f"cmpl-{rid}-0"
        assert kv["do_remote_decode"] is True
        assert kv["remote_port"] == c.d[0].port
        assert kv["remote_cached_tokens"] == 0
        assert p_headers[b"x-request-id"].decode() == rid
        assert c.d[0].metaserver_answers == [200]
        assert c.metric("kvpd_proxy_disaggregated_requests_total") == 1
        assert not c.app.flow.records  # records cleaned up

    run_cluster(t, flow="layerwise")


def test_layerwise_chat_non_streaming_with_internal_ids() -> None:
    async def t(c: Cluster) -> None:
        c.d[0].internal_ids = True  # the decoder reports vLLM's suffixed internal ids
        r = await c.call("POST", "/v1/chat/completions", CHAT)
        assert r.status == 200
        assert r.json()["object"] == "chat.completion"
        rid = c.d[0].requests[0][1][b"x-request-id"].decode()
        assert c.p[0].requests[0][2]["kv_transfer_params"]["request_id"] == (
            f"chatcmpl-{rid}-0a1b2c3d"
        )

    run_cluster(t, flow="layerwise")


def test_layerwise_batch_prompt_waits_for_every_child() -> None:
    async def t(c: Cluster) -> None:
        body = dict(COMPLETION, prompt=["one", "two", "three"], stream=False)
        r = await c.call("POST", "/v1/completions", body)
        assert r.status == 200
        ((_, _, p_body),) = c.p[0].requests  # one prefill for all three prompts
        rid = c.d[0].requests[0][1][b"x-request-id"].decode()
        assert sorted(p_body["batch_kv_transfer_params"]) == [f"cmpl-{rid}-{i}" for i in range(3)]
        assert c.d[0].metaserver_answers == [200, 200, 200]

    run_cluster(t, flow="layerwise")


def test_layerwise_failed_prefill_is_502_and_decoder_released() -> None:
    async def t(c: Cluster) -> None:
        c.p[0].fail_status = 500
        r = await c.call("POST", "/v1/completions", COMPLETION)
        assert r.status == 502
        assert "prefill failed" in r.json()["error"]["message"]
        for _ in range(100):  # the decoder's connection is dropped (vLLM then aborts)
            if not c.d[0]._state.connections and c.d[0].metaserver_answers:
                break
            await asyncio.sleep(0.01)
        assert c.d[0].metaserver_answers == [502]
        assert not c.d[0]._state.connections
        assert c.metric('kvpd_proxy_failures_total{kind="prefill_error"}') == 1

    run_cluster(t, flow="layerwise", max_retries=0)


def token(d_body: dict[str, Any]) -> str:
    """The request's own token in the metaserver URL the proxy gave its decoder."""
    url = str(d_body["kv_transfer_params"]["metaserver"])
    return url.rpartition("?token=")[2]


def test_metaserver_unknown_id_is_404() -> None:
    async def t(c: Cluster) -> None:
        meta = "/v1/metaserver?token=any"
        r = await c.call("POST", meta, {"request_id": "cmpl-nope-0"})
        assert r.status == 404
        r = await c.call("POST", meta, {"no": "id"})
        assert r.status == 400

    run_cluster(t, flow="layerwise")


def test_chunked_request_body_and_expect_continue() -> None:
    async def t(c: Cluster) -> None:
        body = json.dumps(dict(COMPLETION, stream=False)).encode()
        reader, writer = await asyncio.open_connection("127.0.0.1", c.port)
        writer.write(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
            b"Expect: 100-continue\r\nConnection: close\r\n\r\n"
        )
        assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
        half = len(body) // 2
        writer.write(b"%x\r\n%s\r\n" % (half, body[:half]))
        writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(body) - half, body[half:]))
        raw = await reader.read()
        assert raw.startswith(b"HTTP/1.1 200 OK")
        assert b"t0t1t2t3" in raw
        assert c.d[0].requests[0][2]["prompt"] == COMPLETION["prompt"]

    run_cluster(t)


def test_long_pipeline_of_small_requests() -> None:
    async def t(c: Cluster) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", c.port)
        writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n" * 2000)
        seen = b""
        while seen.count(b'{"status":"ok"}') < 2000:
            seen += await reader.read(1 << 20)
        assert seen.count(b"HTTP/1.1 200 OK") == 2000
        writer.close()

    run_cluster(t)


# --- mixed -----------------------------------------------------------------------------------
def test_mixed_flow_balances_over_engines_without_prefill() -> None:
    async def t(c: Cluster) -> None:
        for _ in range(4):
            r = await c.call("POST", "/v1/completions", COMPLETION)
            assert r.status == 200
            assert r.complete
        assert [len(b.requests) for b in c.d] == [2, 2]
        ((_, _, body), *_) = c.d[0].requests
        assert "kv_transfer_params" not in body
        assert body["max_tokens"] == 8
        assert (await c.call("GET", "/health")).status == 200

    run_cluster(t, n_prefill=0, n_decode=2, flow="mixed")


def test_mixed_flow_cli_needs_no_prefillers() -> None:
    from kvpd.proxy.config import parse_args

    cfg = parse_args(
        [
            "--flow",
            "mixed",
            "--prefiller-hosts",
            "--prefiller-ports",
            "--decoder-hosts",
            "127.0.0.1",
            "127.0.0.1",
            "--decoder-ports",
            "9000",
            "9001",
        ]
    )
    assert cfg.prefillers == ()
    assert len(cfg.decoders) == 2


# --- shutdown (SIGTERM: `kvpd down`, `kvpd restart proxy`) ------------------------------------


def test_shutdown_answers_what_was_accepted_and_refuses_the_rest() -> None:
    """Regression (CI, `restart proxy` under load): a connection the proxy had accepted but whose
    request arrived after the stop began was closed without an answer. Now everything accepted
    is answered (in flight, arriving, or sent a moment later), then the connection closes; a
    new connection is refused."""

    async def t(c: Cluster) -> None:
        req = raw_completion()
        port = c.port
        in_flight = asyncio.ensure_future(c.call("POST", "/v1/completions", COMPLETION))
        early_r, early_w = await asyncio.open_connection("127.0.0.1", port)  # sends later
        half_r, half_w = await asyncio.open_connection("127.0.0.1", port)
        half_w.write(req[:20])  # the head is still arriving
        await asyncio.sleep(0.1)  # in_flight is waiting for its decode now
        stopping = asyncio.ensure_future(c.app.stop())
        await asyncio.sleep(0.1)
        with pytest.raises(OSError):
            await asyncio.open_connection("127.0.0.1", port)
        half_w.write(req[20:])
        early_w.write(req)  # keep-alive: the answer says so, then the proxy closes
        for reader in (early_r, half_r):
            raw = await asyncio.wait_for(reader.read(), 10)  # to EOF: the proxy closes
            assert raw.startswith(b"HTTP/1.1 200"), raw[:200]
            assert raw.endswith(b"0\r\n\r\n") or b"content-length" in raw.lower()
        r = await in_flight
        assert r.status == 200
        assert r.complete
        await asyncio.wait_for(stopping, 10)
        assert c.app.state.connections == set()

    run_cluster(t, decode_delay=0.5)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_shutdown_answers_connections_still_in_the_listen_backlog(loop, monkeypatch) -> None:
    """Regression (`restart proxy` under load, clean-clone run): connections the kernel had
    completed but the loop had not accepted yet were reset when the listener closed, and their
    clients, whose requests were sent, saw ECONNRESET. Now the stop accepts them first and
    answers them."""

    async def t(c: Cluster) -> None:
        req = raw_completion(b"Connection: close")
        loop = asyncio.get_running_loop()
        # Connected and sent with no await: the loop cannot accept them before the stop.
        waiting = []
        for _ in range(6):
            s = socket.create_connection(("127.0.0.1", c.port))
            s.sendall(req)
            s.setblocking(False)
            waiting.append(s)
        stopping = asyncio.ensure_future(c.app.stop())  # runs before the loop's next accept
        for s in waiting:
            raw = b""
            while chunk := await asyncio.wait_for(loop.sock_recv(s, 65536), 10):
                raw += chunk
            s.close()
            assert raw.startswith(b"HTTP/1.1 200"), raw[:200]
        await asyncio.wait_for(stopping, 10)
        assert c.app.state.connections == set()

    if loop == "uvloop":  # the proxy's own loop (its wrappers of the listening sockets differ)
        uvloop = pytest.importorskip("uvloop")
        monkeypatch.setattr(asyncio, "run", uvloop.run)
    run_cluster(t)
