"""What the proxy answers where no generation runs, as vLLM does: its error objects carry
`param`, a 405 says Allow, a trailing slash redirects, a non-JSON body is refused with vLLM's
400, a CORS preflight gets vLLM's default answer, /metrics says whose metrics it shows."""

from __future__ import annotations

import json

import pytest

from tests.unit.proxy_cluster import CLIENT_KEY, Cluster, run_cluster
from tests.unit.test_proxy_security import raw

pytestmark = pytest.mark.timeout(30)


def head_and_body(reply: bytes) -> tuple[str, dict[str, str], bytes]:
    head, _, body = reply.partition(b"\r\n\r\n")
    status, *lines = head.decode().split("\r\n")
    return status, {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in lines)}, body


def test_errors_have_vllms_fields_and_405_says_allow() -> None:
    async def t(c: Cluster) -> None:
        r = await c.call("GET", "/v1/completions")
        assert r.status == 405
        assert r.headers["allow"] == "POST"
        assert list(r.json()["error"]) == ["message", "type", "param", "code"]
        r = await c.call("DELETE", "/ping")
        assert r.status == 405
        assert r.headers["allow"] == "GET, POST"
        r = await c.call("POST", "/v1/completions", [1])
        assert r.status == 400
        assert r.json()["error"]["param"] is None

    run_cluster(t)


def test_a_trailing_slash_redirects_to_the_served_path() -> None:
    async def t(c: Cluster) -> None:
        reply = await raw(c.port, b"POST /v1/completions/?a=1 HTTP/1.1\r\nHost: px:8000\r\n"
                                  b"Content-Length: 0\r\nConnection: close\r\n\r\n")  # fmt: skip
        status, headers, body = head_and_body(reply)
        assert status.startswith("HTTP/1.1 307")
        assert body == b""
        assert headers["location"] == "http://px:8000/v1/completions?a=1"
        r = await c.call("GET", "/nowhere/")
        assert r.status == 404

    run_cluster(t)


@pytest.mark.parametrize("ctype", [b"Content-Type: text/plain\r\n", b""], ids=["text", "none"])
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/tokenize"])
def test_a_body_that_is_not_json_is_refused_as_vllm_does(path: str, ctype: bytes) -> None:
    """Another media type, or none: vLLM checks the Content-Type before the body."""

    async def t(c: Cluster) -> None:
        data = b'{"prompt": "x"}'
        reply = await raw(c.port, b"POST %s HTTP/1.1\r\nHost: x\r\n%s"
                          b"Content-Length: %d\r\nConnection: close\r\n\r\n%s"
                          % (path.encode(), ctype, len(data), data))  # fmt: skip
        status, _, body = head_and_body(reply)
        assert status.startswith("HTTP/1.1 400")
        message = (
            "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed"
        )
        error = {"message": message, "type": "Bad Request", "param": None, "code": 400}
        assert json.loads(body) == {"error": error}
        assert not c.p[0].requests
        assert not c.d[0].requests

    run_cluster(t)


def test_a_cors_preflight_gets_vllms_default_answer_before_the_client_gate() -> None:
    async def t(c: Cluster) -> None:
        reply = await raw(c.port, b"OPTIONS /v1/completions HTTP/1.1\r\nHost: x\r\n"
                          b"Origin: http://evil.example\r\nAccess-Control-Request-Method: POST\r\n"
                          b"Access-Control-Request-Headers: authorization\r\n"
                          b"Connection: close\r\n\r\n")  # fmt: skip
        status, headers, body = head_and_body(reply)
        assert status.startswith("HTTP/1.1 400")
        assert body == b"Disallowed CORS origin"
        assert headers["access-control-max-age"] == "600"
        assert headers["access-control-allow-headers"] == "authorization"
        assert "access-control-allow-origin" not in headers
        # an OPTIONS that is no preflight is an ordinary request: the gate applies
        reply = await raw(c.port, b"OPTIONS /v1/completions HTTP/1.1\r\nHost: x\r\n"
                          b"Connection: close\r\n\r\n")  # fmt: skip
        assert reply.startswith(b"HTTP/1.1 401")

    run_cluster(t, client_key=CLIENT_KEY)


def test_metrics_say_they_are_the_proxys_own() -> None:
    async def t(c: Cluster) -> None:
        r = await c.call("GET", "/metrics")
        assert r.body.startswith(b"# The proxy's own metrics; the engines' are at /metrics/engines")

    run_cluster(t)


def test_the_only_decoder_keeps_its_circuit_closed_on_5xx_answers() -> None:
    async def t(c: Cluster) -> None:
        c.d[0].fail_status = 500
        for _ in range(5):
            r = await c.call("POST", "/v1/completions", {"prompt": "x"})
            assert r.status == 502  # the decoder's failure, never 503 "no usable decoder"
        backend = c.app.decoders.backends[0]
        assert backend.circuit == "closed"
        assert backend.errors >= 5
        c.d[0].fail_status = None
        assert (await c.call("POST", "/v1/completions", {"prompt": "x"})).status == 200

    run_cluster(t, max_retries=0)


def test_one_of_two_decoders_still_opens_its_circuit() -> None:
    async def t(c: Cluster) -> None:
        c.d[0].fail_status = 500
        for _ in range(8):
            await c.call("POST", "/v1/completions", {"prompt": "x"})
        assert c.app.decoders.backends[0].circuit == "open"

    run_cluster(t, n_decode=2, max_retries=0)
