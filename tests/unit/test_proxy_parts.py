"""kvpd proxy pieces: options, HTTP framing, balancing, token estimates, and the process
(readiness via /health, prompt exit on SIGTERM, CLI errors)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from kvpd.proxy.backends import Backend, BackendPool
from kvpd.proxy.config import ProxyConfig, ProxyConfigError, parse_args
from kvpd.proxy.hostpool import HostPool
from kvpd.proxy.http1 import ChunkedReader, HttpParseError, encode_chunk, parse_response_head
from kvpd.proxy.rewrite import child_request_ids, decode_tokens, estimate_prompt_tokens

pytestmark = pytest.mark.timeout(60)


# --- options -----------------------------------------------------------------------------------
def test_vllm_ascend_style_flags() -> None:
    cfg = parse_args(
        ["--host", "10.0.0.5", "--port", "9000", "--prefiller-hosts", "10.0.0.1", "10.0.0.2",
         "--prefiller-ports", "8001", "8002", "--decoder-hosts", "10.0.0.3",
         "--decoder-ports", "8003", "--max-retries", "1", "--flow", "layerwise"]
    )  # fmt: skip
    assert cfg.prefillers == (("10.0.0.1", 8001), ("10.0.0.2", 8002))
    assert cfg.decoders == (("10.0.0.3", 8003),)
    assert cfg.max_retries == 1
    assert cfg.flow == "layerwise"
    assert cfg.metaserver == "http://10.0.0.5:9000/v1/metaserver"


def test_list_length_mismatch_is_a_clear_error() -> None:
    with pytest.raises(ProxyConfigError) as e:
        parse_args(["--decoder-hosts", "a", "b", "--decoder-ports", "1"])
    msg = str(e.value)
    assert "--decoder-hosts has 2 entries but --decoder-ports has 1" in msg
    assert e.value.exit_code == 2


def test_layerwise_refuses_a_wildcard_host() -> None:
    with pytest.raises(ProxyConfigError, match="decoders call http://<host>"):
        parse_args(["--flow", "layerwise", "--host", "0.0.0.0"])
    cfg = parse_args(["--flow", "layerwise", "--host", "0.0.0.0",
                      "--metaserver-url", "http://10.1.1.1:8000/v1/metaserver"])  # fmt: skip
    assert cfg.metaserver == "http://10.1.1.1:8000/v1/metaserver"
    assert parse_args(["--host", "0.0.0.0"]).host == "0.0.0.0"  # fine for prefill-first


def test_joined_ip_addresses_are_rejected() -> None:
    with pytest.raises(ProxyConfigError, match="two addresses run together"):
        parse_args(["--prefiller-hosts", "192.0.0.3192.0.0.3"])
    with pytest.raises(ProxyConfigError, match="must be > 0"):
        ProxyConfig(read_timeout=0)


# --- HTTP framing ------------------------------------------------------------------------------
def test_chunked_reader_across_every_split() -> None:
    payloads = [b"data: one\n\n", b"x" * 300, b"data: [DONE]\n\n"]
    wire = b"".join(encode_chunk(p) for p in payloads) + b"0\r\n\r\n"
    for cut in range(len(wire) + 1):
        for second_cut in (cut, min(len(wire), cut + 3)):
            reader = ChunkedReader(collect=True)
            used = sum(reader.feed(piece) for piece in
                       (wire[:cut], wire[cut:second_cut], wire[second_cut:] + b"NEXT"))  # fmt: skip
            assert reader.done
            assert reader.body() == b"".join(payloads)
            assert used == len(wire)  # the bytes of the next message are not taken


def test_chunked_reader_trailers_and_errors() -> None:
    reader = ChunkedReader()
    assert reader.feed(b"3;ext=1\r\nabc\r\n0\r\nX-T: 1\r\n\r\n") == 27
    assert reader.done
    with pytest.raises(HttpParseError):
        ChunkedReader().feed(b"zz\r\n")


def test_parse_response_head() -> None:
    status, headers = parse_response_head(b"HTTP/1.1 200 OK\r\nContent-Type: x\r\nA:  b ")
    assert status == 200
    assert headers == {b"content-type": b"x", b"a": b"b"}
    assert parse_response_head(b"HTTP/1.0 404 Not Found")[1][b"connection"] == b"close"
    with pytest.raises(HttpParseError):
        parse_response_head(b"garbage")


# --- balancing and estimates ---------------------------------------------------------------------
def _pool(n: int) -> BackendPool:
    loop = asyncio.new_event_loop()
    try:
        return BackendPool("decode", [Backend(HostPool("h", 8000 + i, loop, 1.0))
                                      for i in range(n)], loop)  # fmt: skip
    finally:
        loop.close()


def test_pick_least_outstanding_tokens_with_round_robin_ties() -> None:
    pool = _pool(3)
    assert [pool.pick().name for _ in range(6)] == ["h:8000", "h:8001", "h:8002"] * 2
    a, b, c = pool.backends
    a.begin(100)
    b.begin(50)
    assert {pool.pick().name for _ in range(5)} == {"h:8002"}
    c.begin(500)
    assert pool.pick() is b
    b.healthy = False
    assert pool.pick() is a
    assert pool.pick(exclude=(a,)) is c
    a.healthy = c.healthy = False
    assert pool.pick() is None


def test_token_estimates() -> None:
    assert estimate_prompt_tokens({"prompt": "x" * 400}) == 101
    assert estimate_prompt_tokens({"prompt": [1, 2, 3, 4]}) == 5
    assert estimate_prompt_tokens({"prompt": [[1, 2], [3, 4, 5]]}) == 5
    assert (
        estimate_prompt_tokens(
            {"messages": [{"content": "x" * 40}, {"content": [{"type": "text", "text": "y" * 40}]}]}
        )
        == 21
    )
    assert decode_tokens({"max_tokens": 16, "n": 2}, 10) == 42
    assert decode_tokens({"max_completion_tokens": 8}, 10) == 18


def test_child_request_ids_match_vllm() -> None:
    assert child_request_ids("R", True, {}) == ["chatcmpl-R"]
    assert child_request_ids("R", False, {"prompt": "a"}) == ["cmpl-R-0"]
    assert child_request_ids("R", False, {"prompt": [1, 2]}) == ["cmpl-R-0"]
    assert child_request_ids("R", False, {"prompt": ["a", "b"]}) == ["cmpl-R-0", "cmpl-R-1"]


# --- the process ---------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_process_readiness_and_prompt_sigterm() -> None:
    port, p_port, d_port = _free_port(), _free_port(), _free_port()
    backends = subprocess.Popen(
        [sys.executable, "-m", "kvpd.testing.backend", "--prefill-port", str(p_port),
         "--decode-port", str(d_port)], stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    proxy = subprocess.Popen(
        [sys.executable, "-m", "kvpd.proxy", "--port", str(port), "--prefiller-ports",
         str(p_port), "--decoder-ports", str(d_port), "--health-interval", "0.2"],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert backends.stdout.readline().startswith("prefill=")  # type: ignore[union-attr]
        deadline = time.monotonic() + 20
        status = 0
        while time.monotonic() < deadline:
            try:
                status = _get(f"http://127.0.0.1:{port}/health")
            except OSError:
                status = 0
            if status == 200:
                break
            time.sleep(0.05)
        assert status == 200
        assert _get(f"http://127.0.0.1:{port}/healthcheck") == 200
        backends.send_signal(signal.SIGTERM)  # backends gone: the proxy stops being ready
        backends.wait(10)
        while time.monotonic() < deadline and status == 200:
            status = _get(f"http://127.0.0.1:{port}/health")
            time.sleep(0.05)
        assert status == 503
        t0 = time.monotonic()
        proxy.send_signal(signal.SIGTERM)
        assert proxy.wait(10) == 0
        assert time.monotonic() - t0 < 5
        assert "Traceback" not in proxy.stderr.read()  # type: ignore[union-attr]
    finally:
        for p in (proxy, backends):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_cli_reports_bad_flags_without_traceback() -> None:
    kvpd = os.path.join(os.path.dirname(sys.executable), "kvpd")
    r = subprocess.run(
        [kvpd, "proxy", "--prefiller-hosts", "a", "b", "--prefiller-ports", "1"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert r.returncode == 2
    assert "--prefiller-hosts has 2 entries but --prefiller-ports has 1" in r.stderr
    assert "Traceback" not in r.stderr
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    try:
        r = subprocess.run(
            [sys.executable, "-m", "kvpd.proxy", "--port", str(busy.getsockname()[1])],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
    finally:
        busy.close()
    assert r.returncode == 2
    assert "cannot listen on" in r.stderr
    assert "Traceback" not in r.stderr


def test_prefill_and_first_byte_waits_may_be_unlimited_but_not_negative() -> None:
    assert ProxyConfig(prefill_timeout=0, first_byte_timeout=0).prefill_timeout == 0
    with pytest.raises(ProxyConfigError, match="--prefill-timeout must be >= 0"):
        ProxyConfig(prefill_timeout=-1)
    with pytest.raises(ProxyConfigError, match="--first-byte-timeout must be >= 0"):
        ProxyConfig(first_byte_timeout=-1)
