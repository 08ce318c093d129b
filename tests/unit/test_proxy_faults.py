"""The proxy under faults, with stand-in backends (kvpd.testing.backend): a decoder SIGKILLed
with streams in flight, prefillers killed or failing, hung and crawling backends and the circuit
breaker, clients that go away or stop reading. Bounds here ("within the read timeout") are
correctness checks with generous margins, not timing measurements."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
from typing import Any

import pytest

from kvpd.proxy.app import ProxyApp
from kvpd.proxy.config import ProxyConfig
from kvpd.testing.backend import StandInBackend
from tests.unit.proxy_cluster import COMPLETION, Cluster, Reply, call, run_cluster

pytestmark = pytest.mark.timeout(90)


# --- a decoder SIGKILLed mid-stream ------------------------------------------------------------
async def start_decoder_process(port: int = 0) -> tuple[asyncio.subprocess.Process, int]:
    """A stand-in decoder in its own process (so it can be SIGKILLed): 40 events, 50 ms apart."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kvpd.testing.backend", "--decode-port", str(port),
        "--delay-ms", "0", "--chunks", "40", "--chunk-gap-ms", "50",
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
    return proc, int(line.strip().split("=")[1])


async def stop_process(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.kill()
    await proc.wait()


def _three_broken_three_whole(replies: list[Reply], victim_port: int) -> None:
    """The killed decoder's three streams end with an error event, never [DONE], naming no
    backend address; the other decoder's three end whole."""
    broken = [r for r in replies if not r.complete]
    whole = [r for r in replies if r.complete]
    assert len(broken) == 3
    assert len(whole) == 3
    for r in broken:
        assert r.status == 200
        assert "[DONE]" not in r.events()
        last = json.loads(r.events()[-1])
        assert last["error"]["type"] == "stream_broken"
        assert str(victim_port) not in r.body.decode()  # no backend address in errors
    for r in whole:
        assert r.events()[-1] == "[DONE]"


def test_decoder_sigkilled_mid_stream() -> None:
    """Its streams end at once with an SSE error event and a close (never [DONE]); new requests
    go to the other decoder; nothing hangs; the restarted decoder is taken back."""

    async def main() -> None:
        prefiller = await StandInBackend("prefill", record=False).start()
        (victim, v_port), (other, o_port) = [await start_decoder_process() for _ in range(2)]
        cfg = ProxyConfig(
            port=0,
            prefillers=(("127.0.0.1", prefiller.port),),
            decoders=(("127.0.0.1", v_port), ("127.0.0.1", o_port)),
            health_interval=0.2,
            read_timeout=5.0,
            retry_delay=0.0,
            breaker_cooldown=0.5,
        )
        app = ProxyApp(cfg)
        await app.start()
        loop = asyncio.get_running_loop()
        try:
            await app.health.wait_round()
            body = dict(COMPLETION, max_tokens=40)
            streams = [asyncio.ensure_future(call(app.port, "POST", "/v1/completions", body))
                       for _ in range(6)]  # fmt: skip
            dead = app.decoders.backends[0]
            while dead.inflight < 3 or app.decoders.backends[1].inflight < 3:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.3)  # events are flowing on every stream
            os.kill(victim.pid, signal.SIGKILL)
            killed_at = loop.time()
            replies: list[Reply] = []
            for s in streams:
                replies.append(await s)
                assert loop.time() - killed_at < cfg.read_timeout  # none hangs
            # (a stream still running here ends within its 2 s of events)
            _three_broken_three_whole(replies, v_port)

            # New requests: the dead decoder refuses connections; they go to the other one.
            short = dict(body, max_tokens=2)
            again = [call(app.port, "POST", "/v1/completions", short) for _ in range(4)]
            for r in await asyncio.gather(*again):
                assert r.status == 200
                assert r.complete
            assert dead.healthy is False

            # Restarted on the same port: taken back (health check, then a probe request).
            victim, _ = await start_decoder_process(v_port)
            while not dead.usable:
                await asyncio.sleep(0.05)
            before = dead.requests
            again = [call(app.port, "POST", "/v1/completions", short) for _ in range(4)]
            for r in await asyncio.gather(*again):
                assert r.status == 200
                assert r.complete
            assert dead.requests > before
            assert dead.circuit == "closed"
        finally:
            await app.stop()
            await prefiller.stop()
            for proc in (victim, other):
                await stop_process(proc)

    asyncio.run(main())


# --- prefillers killed or failing --------------------------------------------------------------
def _decode_kv(c: Cluster) -> list[Any]:
    return [body.get("kv_transfer_params") for _, _, body in c.d[0].requests]


def test_prefiller_5xx_is_retried_on_another_prefiller_never_decoded_without_kv() -> None:
    async def t(c: Cluster) -> None:
        c.p[0].fail_status = 503
        for _ in range(4):
            r = await c.call("POST", "/v1/completions", COMPLETION)
            assert r.status == 200
            assert r.complete
        kvs = _decode_kv(c)
        assert len(kvs) == 4
        assert all(kv and kv["remote_engine_id"] == f"fake-{c.p[1].port}" for kv in kvs)

    run_cluster(t, n_prefill=2)


def test_prefiller_killed_mid_request_is_retried_before_anything_is_sent() -> None:
    async def t(c: Cluster) -> None:
        c.p[0].hang = True
        c.p[1].hang = True  # both hang: the first pick holds the request, whichever it is
        pending = asyncio.ensure_future(c.call("POST", "/v1/completions", COMPLETION))
        while sum(p.served for p in c.p) < 1:
            await asyncio.sleep(0.01)
        victim, survivor = (c.p[0], c.p[1]) if c.p[0].served else (c.p[1], c.p[0])
        survivor.hang = False
        await victim.stop()  # the process dies: its connections reset
        r = await pending
        assert r.status == 200
        assert r.complete
        assert r.events()[-1] == "[DONE]"
        kvs = _decode_kv(c)
        assert len(kvs) == 1
        assert kvs[0]["remote_engine_id"] == f"fake-{survivor.port}"

    run_cluster(t, n_prefill=2)


def test_every_prefiller_failing_never_reaches_a_decoder() -> None:
    async def t(c: Cluster) -> None:
        for p in c.p:
            p.fail_status = 500
        r = await c.call("POST", "/v1/completions", COMPLETION)
        assert r.status == 502
        assert c.d[0].requests == []

    run_cluster(t, n_prefill=2)


# --- hung and crawling backends, circuit breaker -----------------------------------------------
def test_hung_decoder_opens_the_circuit_then_half_open_probe_closes_it() -> None:
    async def t(c: Cluster) -> None:
        loop = asyncio.get_running_loop()
        sick = c.app.decoders.backends[0]
        c.d[0].hang = True  # /health still answers: only the requests show the problem
        results = []
        for _ in range(6):
            started = loop.time()
            r = await c.call("POST", "/v1/completions", COMPLETION)
            assert loop.time() - started < 5  # bounded by the 0.3 s first-byte timeout
            results.append(r.status)
        assert results.count(504) == 2  # two timeouts on decode-0 open its circuit
        assert results.count(200) == 4
        assert sick.circuit == "open"
        open_ = 'kvpd_proxy_backend_transitions_total{role="decode",backend="decode-0",to="open"}'
        assert c.metric(open_) == 1
        state = 'kvpd_proxy_backend_circuit{role="decode",backend="decode-0",state="open"}'
        assert c.metric(state) == 1

        c.d[0].hang = False
        while sick.circuit != "half_open":  # after the cooldown, on a passing health check
            await asyncio.sleep(0.02)
        half = open_.replace('to="open"', 'to="half_open"')
        assert c.metric(half) == 1
        served = len(c.d[0].requests)
        for _ in range(4):
            assert (await c.call("POST", "/v1/completions", COMPLETION)).status == 200
        assert len(c.d[0].requests) > served  # the probe went there and succeeded
        assert sick.circuit == "closed"
        assert c.metric(open_.replace('to="open"', 'to="closed"')) == 1
        assert c.metric(state.replace('state="open"', 'state="closed"')) == 1

    run_cluster(
        t, n_decode=2, first_byte_timeout=0.3, max_retries=0, breaker_failures=2,
        breaker_cooldown=0.3, health_interval=0.05,
    )  # fmt: skip


def test_crawling_backend_is_bounded_by_the_read_timeout() -> None:
    async def t(c: Cluster) -> None:
        loop = asyncio.get_running_loop()
        c.d[0].trickle_s = 60.0  # one byte a minute
        started = loop.time()
        r = await c.call("POST", "/v1/completions", COMPLETION)
        assert loop.time() - started < 5
        assert r.status == 504
        assert r.json()["error"]["type"] == "decode_timeout"

        c.d[0].trickle_s = 0.0
        c.p[0].trickle_s = 60.0
        started = loop.time()
        r = await c.call("POST", "/v1/completions", COMPLETION)
        assert loop.time() - started < 5
        assert r.status == 502
        assert r.json()["error"]["type"] == "prefill_timeout"

    run_cluster(t, read_timeout=0.3, prefill_timeout=0.3)


def test_silent_backend_is_taken_out_by_health_checks() -> None:
    async def t(c: Cluster) -> None:
        c.d[0].silent = True  # accepts connections, never answers anything
        while c.app.decoders.backends[0].healthy is not False:
            await asyncio.sleep(0.02)
        for _ in range(3):
            assert (await c.call("POST", "/v1/completions", COMPLETION)).status == 200
        unhealthy = (
            'kvpd_proxy_backend_transitions_total{role="decode",backend="decode-0",to="unhealthy"}'
        )
        assert c.metric(unhealthy) == 1
        c.d[0].silent = False
        while c.app.decoders.backends[0].healthy is not True:
            await asyncio.sleep(0.02)
        assert c.metric(unhealthy.replace("unhealthy", "healthy")) == 1

    run_cluster(t, n_decode=2, health_interval=0.05, health_timeout=0.2)


# --- clients that go away or stop reading ------------------------------------------------------
def test_client_gone_during_prefill_drops_the_prefill_at_once() -> None:
    async def t(c: Cluster) -> None:
        c.p[0].hang = True
        body = json.dumps(COMPLETION).encode()
        reader, writer = await asyncio.open_connection("127.0.0.1", c.port)
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                     % (len(body), body))  # fmt: skip
        while not c.p[0]._state.connections or not c.p[0].served:
            await asyncio.sleep(0.01)
        writer.transport.abort()
        for _ in range(200):
            if not c.p[0]._state.connections:
                break
            await asyncio.sleep(0.01)
        assert not c.p[0]._state.connections  # the prefill request was dropped
        assert c.d[0].requests == []
        assert c.metric('kvpd_proxy_failures_total{kind="client_disconnect"}') == 1
        assert c.metric("kvpd_proxy_inflight_requests") == 0

    run_cluster(t)


def test_client_that_stops_reading_is_bounded_and_others_are_unaffected() -> None:
    async def t(c: Cluster) -> None:
        c.d[0].chunks = 100000  # ~10 MB of events, written as fast as the socket takes them
        body = json.dumps(dict(COMPLETION, max_tokens=100000)).encode()
        reader, writer = await asyncio.open_connection("127.0.0.1", c.port, limit=1024)
        writer.transport.set_write_buffer_limits(0)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                     % (len(body), body))  # fmt: skip
        await reader.readuntil(b"data: ")
        writer.transport.pause_reading()  # and never read again
        slow = None
        for _ in range(500):
            slow = next((x for x in c.app.state.connections if x.paused), None)
            if slow is not None:
                break
            await asyncio.sleep(0.01)
        assert slow is not None
        assert slow.transport is not None
        for _ in range(5):  # others are served meanwhile
            other = dict(COMPLETION, max_tokens=4)
            c.d[0].chunks = 4
            r = await c.call("POST", "/v1/completions", other)
            assert r.status == 200
            assert r.complete
        # The proxy holds at most its write-buffer high-water mark for the stalled client.
        assert slow.transport.get_write_buffer_size() <= 1 << 20
        # After the client timeout the stalled client is dropped, and its decoder stream too.
        for _ in range(500):
            if slow.closed:
                break
            await asyncio.sleep(0.01)
        assert slow.closed
        for _ in range(200):  # its decoder stream was dropped with it
            if c.app.decoders.backends[0].inflight == 0:
                break
            await asyncio.sleep(0.01)
        assert c.app.decoders.backends[0].inflight == 0
        writer.close()

    run_cluster(t, client_timeout=1.0)
