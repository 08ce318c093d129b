"""The proxy's clients are untrusted: who may call what (client key, admin token, metaserver
token), what of a client's body reaches an engine (never a proxy-reserved field, never the raw
bytes), and what a client without credentials can hold (connections, buffered bytes, time) or
provoke (a traceback, an error body it shapes)."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from kvpd.proxy.config import CLIENT_KEY_ENV, ProxyConfig, ProxyConfigError, parse_args
from tests.unit.proxy_cluster import CLIENT_AUTH, CLIENT_KEY, COMPLETION, Cluster, run_cluster

pytestmark = pytest.mark.timeout(60)

ADMIN = "admin-token-0123456789abcdef-0123456789"
ADMIN_AUTH = {"Authorization": f"Bearer {ADMIN}"}
EVIL_KV = {"do_remote_prefill": True, "remote_host": "203.0.113.9", "remote_port": 1}


async def raw(port: int, data: bytes) -> bytes:
    """Send bytes as they are; everything the proxy answers until it closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    try:
        out = await asyncio.wait_for(reader.read(), 10)
    except ConnectionError:
        out = b""
    writer.close()
    return out


def post(body: bytes, path: str = "/v1/completions", extra: str = "") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n{extra}\r\n"
    ).encode() + body


def error_of(reply: bytes) -> dict[str, object]:
    """The JSON error object of a raw reply (which must parse: never a formatted body)."""
    error = json.loads(reply.partition(b"\r\n\r\n")[2])["error"]
    assert isinstance(error, dict)
    return error


# --- who may call what -------------------------------------------------------------------------
def test_a_backend_key_is_never_lent_to_a_client_without_the_client_key() -> None:
    async def t(c: Cluster) -> None:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": CLIENT_KEY}):
            for method, path in (("POST", "/v1/completions"), ("POST", "/v1/chat/completions"),
                                 ("GET", "/v1/models"), ("GET", "/nope")):  # fmt: skip
                r = await c.call(method, path, COMPLETION, headers=headers)
                assert r.status == 401, (path, headers)
                err = r.json()["error"]
                assert err["code"] == 401
                assert "client key" in err["message"]
                assert r.headers["www-authenticate"] == "Bearer"
        assert c.p[0].requests == []
        assert c.d[0].requests == []
        assert c.metric("kvpd_proxy_unauthorized_total") == 12
        for path in ("/health", "/healthcheck", "/metrics"):  # open, for probes and scrapers
            assert (await c.call("GET", path)).status == 200
        r = await c.call("POST", "/v1/completions", COMPLETION, headers=CLIENT_AUTH)
        assert r.status == 200
        assert c.d[0].requests[0][1][b"authorization"] == b"Bearer sk-backend"

    run_cluster(t, api_key="sk-backend", client_key=CLIENT_KEY)


def test_a_client_without_the_key_is_refused_before_its_body_is_read() -> None:
    async def t(c: Cluster) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", c.port)
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 9000000\r\n\r\n")
        writer.write(b"a" * 1000)  # the body it announced never comes: no matter
        reply = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        assert reply.startswith(b"HTTP/1.1 401")
        assert b"connection: close" in reply
        assert c.app.state.buffered == 0

    run_cluster(t, client_key=CLIENT_KEY)


def test_open_paths_are_configurable() -> None:
    async def t(c: Cluster) -> None:
        assert (await c.call("GET", "/health")).status == 200
        assert (await c.call("GET", "/metrics")).status == 401

    run_cluster(t, client_key=CLIENT_KEY, open_paths="/health")
    with pytest.raises(ProxyConfigError, match="--open-paths: 'metrics' is not a path"):
        ProxyConfig(open_paths="/health,metrics")


def test_a_backend_key_without_a_client_key_is_refused_and_short_secrets_too() -> None:
    with pytest.raises(ProxyConfigError, match="OPENAI_API_KEY is set: it is a credential for"):
        parse_args([], environ={"OPENAI_API_KEY": "sk-x"})
    cfg = parse_args([], environ={"OPENAI_API_KEY": "sk-x", CLIENT_KEY_ENV: CLIENT_KEY})
    assert cfg.client_key == CLIENT_KEY
    assert CLIENT_KEY not in repr(cfg)
    for name in (CLIENT_KEY_ENV, "KVPD_PROXY_ADMIN_TOKEN"):
        with pytest.raises(ProxyConfigError, match=f"{name} .*at least 32 printable"):
            parse_args([], environ={name: "short-token"})
    with pytest.raises(SystemExit):  # never a flag: `ps` would show it
        parse_args(["--client-key", CLIENT_KEY], environ={})


def test_the_admin_interface_needs_its_token_always_and_refuses_browsers() -> None:
    async def no_token(c: Cluster) -> None:  # loopback is no credential
        r = await c.call("GET", "/admin/backends")
        assert r.status == 403
        assert "admin interface is off" in r.json()["error"]["message"]
        assert (await c.call("POST", "/admin/reset_prefix_cache")).status == 403

    run_cluster(no_token)

    async def token(c: Cluster) -> None:
        drain = {"backend": "decode-0", "timeout": 0}
        r = await c.call("POST", "/admin/drain", drain, headers={**ADMIN_AUTH, "Origin": "x"})
        assert r.status == 403
        assert "Origin" in r.json()["error"]["message"]
        body = json.dumps(drain).encode()
        reply = await raw(c.port, post(body, "/admin/drain", f"Authorization: Bearer {ADMIN}\r\n")
                          .replace(b"application/json", b"text/plain"))  # fmt: skip
        assert reply.startswith(b"HTTP/1.1 403")
        assert b"application/json bodies" in reply
        assert not c.app.decoders.backends[0].draining
        # the client key opens generation, not the admin interface
        r = await c.call("GET", "/admin/backends", headers=CLIENT_AUTH)
        assert r.status == 403
        assert (await c.call("GET", "/admin/backends", headers=ADMIN_AUTH)).status == 200

    run_cluster(token, admin_token=ADMIN, client_key=CLIENT_KEY)


def test_reset_prefix_cache_is_admin_only() -> None:
    async def t(c: Cluster) -> None:
        resets: list[int] = []
        for b in c.p + c.d:
            b._reset = lambda client, req, n=resets: (n.append(1), client.send_json(200, b"{}"))
            b._router.add("POST", "/reset_prefix_cache", b._reset)
        r = await c.call("POST", "/reset_prefix_cache", headers=CLIENT_AUTH)
        assert r.status == 404
        assert resets == []
        r = await c.call("POST", "/admin/reset_prefix_cache", headers=CLIENT_AUTH)
        assert r.status == 403
        r = await c.call("POST", "/admin/reset_prefix_cache", headers=ADMIN_AUTH)
        assert r.status == 200
        assert len(resets) == 2

    run_cluster(t, admin_token=ADMIN, client_key=CLIENT_KEY)


def test_only_a_requests_decoder_may_report_it_to_the_metaserver() -> None:
    async def t(c: Cluster) -> None:
        c.d[0].hang = True  # the decoder holds the request without reporting it
        pending = asyncio.ensure_future(
            c.call("POST", "/v1/completions", COMPLETION, headers=CLIENT_AUTH)
        )
        while not c.d[0].requests:
            await asyncio.sleep(0.01)
        _, headers, body = c.d[0].requests[0]
        child = f"cmpl-{headers[b'x-request-id'].decode()}-0"
        url = body["kv_transfer_params"]["metaserver"]
        assert url.startswith(f"http://127.0.0.1:{c.port}/v1/metaserver?token=")
        for path in ("/v1/metaserver", "/v1/metaserver?token=guess", url.replace("=", "=x")):
            report = {"request_id": child, "remote_host": "203.0.113.9"}
            r = await c.call("POST", path[path.index("/v1") :], report, headers=CLIENT_AUTH)
            assert r.status == 403
            assert "decoder" in r.json()["error"]["message"]
        assert c.metric('kvpd_proxy_failures_total{kind="metaserver_forbidden"}') == 3
        assert c.p[0].requests == []  # no prefill was dispatched for the forged reports
        pending.cancel()
        c.d[0].hang = False
        r = await c.call("POST", "/v1/completions", COMPLETION, headers=CLIENT_AUTH)
        assert r.status == 200
        assert c.d[0].metaserver_answers == [200]
        tokens = {b["kv_transfer_params"]["metaserver"] for _, _, b in c.d[0].requests}
        assert len(tokens) == 2  # one token per request

    run_cluster(t, flow="layerwise", client_key=CLIENT_KEY)


# --- what of a client's body reaches an engine -------------------------------------------------
@pytest.mark.parametrize("flow", ["prefill-first", "mixed", "layerwise"])
@pytest.mark.parametrize("prefill_params", [True, False])
def test_client_kv_transfer_fields_never_reach_an_engine(flow: str, prefill_params: bool) -> None:
    if flow != "prefill-first" and not prefill_params:
        pytest.skip("only prefill-first reads the prefill's kv_transfer_params")
    xargs = {"kv_transfer_params": "203.0.113.9", "ec_transfer_params": 1, "k": 2}
    body = dict(COMPLETION, kv_transfer_params=EVIL_KV, batch_kv_transfer_params={"a": EVIL_KV},
                ec_transfer_params=EVIL_KV, vllm_xargs=xargs)  # fmt: skip
    # a repeated key: a parser that keeps the first one would see the client's value
    text = json.dumps(body)[:-1] + ', "kv_transfer_params": {"remote_host": "203.0.113.9"}}'

    async def t(c: Cluster) -> None:
        if not prefill_params:  # e.g. ExampleConnector: nothing to forward
            c.p[0]._prefill_answer = lambda client, req, b: client.send_json(200, b'{"id":"x"}')
        for data in (json.dumps(body).encode(), text.encode(), text.encode("utf-8")):
            reply = await raw(c.port, post(data, extra=f"Authorization: Bearer {CLIENT_KEY}\r\n"))
            assert reply.startswith(b"HTTP/1.1 200")
        seen = [b for backend in c.p + c.d for _, _, b in backend.requests]
        assert seen
        assert all(b.get("kv_transfer_params") != EVIL_KV for b in seen)
        assert "203.0.113.9" not in json.dumps(seen)
        assert "batch_kv" not in json.dumps(seen)
        assert all(b.get("vllm_xargs") == {"k": 2} for b in seen)  # the rest is kept
        assert not any("ec_transfer_params" in b for b in seen)

    n_prefill = 0 if flow == "mixed" else 1
    run_cluster(t, n_prefill=n_prefill, flow=flow, client_key=CLIENT_KEY)


# --- what a client without credentials can hold or provoke -------------------------------------
BAD_BODIES = [
    b"[" * 100_000 + b"]" * 100_000,  # nested too deeply for the parser: RecursionError
    b'{"prompt": "' + b"\\ud83d" + b'", "max_tokens": 2}',  # a lone surrogate: no UTF-8 form
    b'{"prompt": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
    b"[1, 2]",
    b'"text"',
    b"\xff\xfe not utf-8",
    b"{",
]


def test_bodies_that_cannot_be_handled_get_a_400_never_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def t(c: Cluster) -> None:
        with caplog.at_level(logging.DEBUG, logger="kvpd.proxy"):
            for data in BAD_BODIES:
                for path in ("/v1/completions", "/v1/chat/completions"):
                    reply = await raw(c.port, post(data, path))
                    assert reply.startswith(b"HTTP/1.1 400"), (data[:40], reply[:200])
                    err = error_of(reply)
                    assert err["code"] == 400
                    assert err["type"] == "bad_request"
            # odd but valid shapes are served (the token estimate is total over any JSON)
            for odd in ({"prompt": "hi", "max_tokens": 1e400}, {"messages": 5, "n": "x"},
                        {"prompt": [{"a": 1}, None, 3], "max_tokens": [1]}):  # fmt: skip
                reply = await raw(c.port, post(json.dumps(odd).encode()))
                assert reply.startswith(b"HTTP/1.1 200"), (odd, reply[:200])
        assert not [r for r in caplog.records if r.exc_info], caplog.text
        assert "Traceback" not in caplog.text

    run_cluster(t)


ODD_VALUES = [None, 10**400, 1e308, -1, [1], {"a": {}}, "x" * 300, "\\ud83d", True]


@pytest.mark.parametrize("flow", ["prefill-first", "layerwise"])
def test_no_route_answers_500_or_logs_a_traceback_for_any_body(
    caplog: pytest.LogCaptureFixture, flow: str
) -> None:
    """Every route, with the credentials it needs, given bodies that are not what it expects."""

    async def t(c: Cluster) -> None:
        routes = [*c.app.state.router.sync, *c.app.state.router.async_]
        answered: list[int] = []
        bodies = [*BAD_BODIES[1:], b"{}", b"null"]
        bodies += [json.dumps({k: v}).encode() for k in ("backend", "timeout", "request_id",
                   "prompt", "messages", "max_tokens", "n") for v in ODD_VALUES]  # fmt: skip
        with caplog.at_level(logging.DEBUG, logger="kvpd.proxy"):
            for method, path in routes:
                key = ADMIN if path.startswith(b"/admin/") else CLIENT_KEY
                target = path + (b"?token=x" if path.endswith(b"metaserver") else b"")
                for data in bodies:
                    reply = await raw(c.port, method + b" " + target + (
                        b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                        b"Content-Length: %d\r\nConnection: close\r\n"
                        b"Authorization: Bearer %s\r\n\r\n%s" % (len(data), key.encode(), data)
                    ))  # fmt: skip
                    status = int(reply.split(b" ", 2)[1]) if reply else 0
                    assert 200 <= status < 500, (method, path, data[:60], reply[:300])
                    answered.append(status)
        assert len(answered) == len(routes) * len(bodies) > 500
        assert not [r for r in caplog.records if r.exc_info], caplog.text

    run_cluster(t, flow=flow, admin_token=ADMIN, client_key=CLIENT_KEY)


def test_protocol_errors_are_json_whatever_the_client_sent() -> None:
    async def t(c: Cluster) -> None:
        head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        reply = await raw(c.port, head + b'zz"},"x":{"\r\n')
        assert reply.startswith(b"HTTP/1.1 400")
        err = error_of(reply)  # the client's bytes are inside the message, quoted as data
        assert set(err) == {"message", "type", "param", "code"}
        assert "x" not in err
        assert err["type"] == "BadRequestError"
        assert '"},' in str(err["message"])

    run_cluster(t)


def test_connections_per_peer_and_body_sizes_are_bounded() -> None:
    async def t(c: Cluster) -> None:
        held = [await asyncio.open_connection("127.0.0.1", c.port) for _ in range(2)]
        reply = await raw(c.port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert reply.startswith(b"HTTP/1.1 503")
        assert b"from this address" in reply
        for _, w in held:
            w.close()
        await asyncio.sleep(0.1)
        reply = await raw(c.port, post(json.dumps(dict(COMPLETION, prompt="a" * 5000)).encode()))
        assert reply.startswith(b"HTTP/1.1 413")
        assert b"larger than 4096" in reply
        assert c.app.state.buffered == 0

    run_cluster(t, max_connections_per_peer=2, max_body_bytes=4096)


def test_buffered_body_bytes_are_bounded_over_all_clients() -> None:
    async def t(c: Cluster) -> None:
        head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 3000\r\n\r\n"
        first = await asyncio.open_connection("127.0.0.1", c.port)
        first[1].write(head + b"a" * 2000)  # a body on the way, held
        await first[1].drain()
        while c.app.state.buffered < 2000:
            await asyncio.sleep(0.01)
        reply = await raw(c.port, head + b"b" * 2000)  # would hold 4000 > 3000 in all
        assert reply.startswith(b"HTTP/1.1 503")
        assert b"too many request bodies" in reply
        first[1].close()
        while c.app.state.buffered:  # released when the first client goes away
            await asyncio.sleep(0.01)

    run_cluster(t, max_buffered_bytes=3000)
