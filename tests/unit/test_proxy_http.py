"""Hostile HTTP against the proxy: request smuggling shapes, oversized and slow requests,
invalid methods, targets and bytes each get a 4xx or a closed connection, the proxy keeps
serving, and a stream running meanwhile is unaffected. Plus a differential fuzz test against
h11 (a well-kept reference parser): what h11 rejects, kvpd rejects; what both accept, both read
the same way."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import h11
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvpd.proxy.routing import Request, Router
from kvpd.proxy.server import ClientConnection, Limits, ServerState
from tests.unit.proxy_cluster import COMPLETION, Cluster, run_cluster

pytestmark = pytest.mark.timeout(60)

H = b"Host: x\r\n"
POST = b"POST /v1/completions HTTP/1.1\r\n" + H
CLOSE = b"Connection: close\r\n\r\n"  # (404/405 keep the connection open otherwise)
HOSTILE: dict[str, bytes] = {
    "CL and TE": POST + b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "TE and CL": POST + b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n",
    "two equal CL": POST + b"Content-Length: 2\r\nContent-Length: 2\r\n\r\n{}",
    "two different CL": POST + b"Content-Length: 2\r\nContent-Length: 12\r\n\r\n{}",
    "CL list": POST + b"Content-Length: 2, 2\r\n\r\n{}",
    "CL with sign": POST + b"Content-Length: +2\r\n\r\n{}",
    "CL negative": POST + b"Content-Length: -1\r\n\r\n{}",
    "CL hex": POST + b"Content-Length: 0x2\r\n\r\n{}",
    "CL huge number": POST + b"Content-Length: 99999999999999999999999\r\n\r\n{}",
    "obs-fold": POST + b"X-A: 1\r\n  folded\r\nContent-Length: 2\r\n\r\n{}",
    "obs-fold of CL": POST + b"Content-Length:\r\n 2\r\n\r\n{}",
    "bare LF everywhere": b"GET /health HTTP/1.1\nHost: x\n\n",
    "bare LF in one line": b"GET /health HTTP/1.1\r\nHost: x\nX-A: 1\r\n\r\n",
    "space before colon": POST + b"Content-Length : 2\r\n\r\n{}",
    "TE chunked, identity": POST + b"Transfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n",
    "TE identity": POST + b"Transfer-Encoding: identity\r\n\r\n{}",
    "TE twice": POST + b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "TE in HTTP/1.0": (
        b"POST /v1/completions HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
    ),
    "chunk size not hex": POST + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n",
    "chunk size negative": POST + b"Transfer-Encoding: chunked\r\n\r\n-1\r\n",
    "chunk size 0x": POST + b"Transfer-Encoding: chunked\r\n\r\n0x2\r\n{}\r\n0\r\n\r\n",
    "chunk size with space": POST + b"Transfer-Encoding: chunked\r\n\r\n 2\r\n{}\r\n0\r\n\r\n",
    "chunk size huge": POST + b"Transfer-Encoding: chunked\r\n\r\nffffffffffffffff\r\n",
    "chunk size too long": POST + b"Transfer-Encoding: chunked\r\n\r\n" + b"1" * 40 + b"\r\n",
    "chunk without CRLF": POST + b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}XX0\r\n\r\n",
    "request line too long": b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\n" + H + b"\r\n",
    "head too large": b"GET /health HTTP/1.1\r\n" + H + b"X-A: " + b"a" * 70000 + b"\r\n\r\n",
    "too many headers": b"GET /health HTTP/1.1\r\n" + H + b"X-A: 1\r\n" * 101 + b"\r\n",
    "body too large": POST + b"Content-Length: 100000000\r\n\r\n{}",
    "chunked body too large": POST + b"Transfer-Encoding: chunked\r\n\r\n5000000\r\n",
    "invalid method": b"G@T /health HTTP/1.1\r\n" + H + b"\r\n",
    "unknown method": b"BREW /health HTTP/1.1\r\n" + H + CLOSE,
    "wrong method": b"GET /v1/completions HTTP/1.1\r\n" + H + CLOSE,
    "relative path": b"GET health HTTP/1.1\r\n" + H + b"\r\n",
    "absolute URL": b"GET http://evil/health HTTP/1.1\r\n" + H + b"\r\n",
    "unknown path": b"GET /../../etc/passwd HTTP/1.1\r\n" + H + CLOSE,
    "two spaces": b"GET  /health HTTP/1.1\r\n" + H + b"\r\n",
    "bad version": b"GET /health HTTQ/1.1\r\n" + H + b"\r\n",
    "no Host": b"GET /health HTTP/1.1\r\n\r\n",
    "two Hosts": b"GET /health HTTP/1.1\r\n" + H + H + b"\r\n",
    "two Authorization": POST
    + b"Authorization: a\r\nAuthorization: b\r\nContent-Length: 2\r\n\r\n{}",
    "NUL in header": b"GET /health HTTP/1.1\r\n" + H + b"X-A: a\x00b\r\n\r\n",
    "NUL in target": b"GET /hea\x00lth HTTP/1.1\r\n" + H + b"\r\n",
    "non-UTF-8 header": b"GET /health HTTP/1.1\r\n" + H + b"X-A: \xff\xfe\r\n\r\n",
    "non-UTF-8 target": b"GET /\xff HTTP/1.1\r\n" + H + b"\r\n",
    "control char": b"GET /health HTTP/1.1\r\n" + H + b"X-A: a\x1bb\r\n\r\n",
    "binary garbage": bytes(range(256)) + b"\r\n\r\n",
    "TLS hello": b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 64 + b"\r\n\r\n",
}


async def exchange(port: int, data: bytes, timeout: float = 10.0) -> bytes:
    """Send `data`; read the answer until the proxy closes (or `timeout`)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    out = b""
    try:
        out = await asyncio.wait_for(reader.read(), timeout)
    except (ConnectionResetError, asyncio.TimeoutError):
        pass
    writer.close()
    return out


def test_hostile_requests_get_4xx_or_close_and_others_are_unaffected() -> None:
    async def t(c: Cluster) -> None:
        c.d[0].chunk_gap_s = 0.05  # a stream that runs through the whole barrage
        body = dict(COMPLETION, max_tokens=8)
        stream = asyncio.ensure_future(c.call("POST", "/v1/completions", body))
        answers: dict[str, bytes] = {}
        for name, data in HOSTILE.items():
            answers[name] = await exchange(c.port, data)
        for name, raw in answers.items():
            status = raw[9:12]
            assert raw == b"" or (raw.startswith(b"HTTP/1.1 4") and status != b"200"), (
                name,
                raw[:120],
            )
        assert answers["request line too long"].startswith(b"HTTP/1.1 414")
        # closed while the client still sends: its kernel may see a reset before the 431
        assert answers["head too large"][:12] in (b"HTTP/1.1 431", b"")
        assert answers["too many headers"].startswith(b"HTTP/1.1 431")
        assert answers["body too large"].startswith(b"HTTP/1.1 413")
        assert answers["chunked body too large"].startswith(b"HTTP/1.1 413")
        assert b"repeated authorization" in answers["two Authorization"]
        assert c.d[0].requests == [] or len(c.d[0].requests) == 1  # only the good stream
        r = await stream
        assert r.status == 200
        assert r.complete
        assert r.events()[-1] == "[DONE]"
        assert (await c.call("GET", "/health")).status == 200  # still serving

    run_cluster(t)


def test_slow_loris_head_times_out_and_idle_connections_close() -> None:
    async def t(c: Cluster) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", c.port)
        head = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200
        out = b""
        started = asyncio.get_running_loop().time()
        for byte in head:  # one byte every 20 ms: never a complete head within the timeout
            if writer.is_closing() or reader.at_eof():
                break
            try:
                writer.write(bytes((byte,)))
                await writer.drain()
            except ConnectionError:
                break
            await asyncio.sleep(0.02)
        try:
            out = await reader.read()
        except ConnectionError:
            out = b""
        writer.close()
        assert out.startswith(b"HTTP/1.1 408") or out == b""
        assert asyncio.get_running_loop().time() - started < 3.5  # 0.5 s timeout, generous
        assert (await c.call("GET", "/health")).status == 200

        reader, writer = await asyncio.open_connection("127.0.0.1", c.port)
        writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await reader.readuntil(b'{"status":"ok"}')).startswith(b"HTTP/1.1 200")
        await asyncio.sleep(1.0)  # kept alive past the client timeout, until idle
        assert not reader.at_eof()
        assert await asyncio.wait_for(reader.read(), 10) == b""  # idle: closed quietly
        writer.close()

    run_cluster(t, client_timeout=0.5, idle_timeout=2.0)


def test_a_connection_that_never_sends_a_byte_gets_the_client_timeout_not_the_idle_one() -> None:
    """It is no keep-alive client yet: it must not hold its slot for the idle timeout."""

    async def t(c: Cluster) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", c.port)
        started = asyncio.get_running_loop().time()
        assert await asyncio.wait_for(reader.read(), 10) == b""  # closed quietly
        writer.close()
        assert asyncio.get_running_loop().time() - started < 3.5  # 0.5 s timeout, generous

    run_cluster(t, client_timeout=0.5, idle_timeout=300.0)


def test_a_flood_of_pipelined_requests_is_not_buffered_without_bound() -> None:
    async def t(c: Cluster) -> None:
        c.d[0].chunk_gap_s = 0.05
        c.d[0].chunks = 40  # a 2 s stream
        body = json.dumps(COMPLETION).encode()
        reader, writer = await asyncio.open_connection("127.0.0.1", c.port)
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                     % (len(body), body))  # fmt: skip
        await reader.readuntil(b"data: ")
        n = 30_000
        writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n" * n)  # 1 MB, pipelined
        await asyncio.sleep(0.3)
        (conn,) = c.app.state.connections
        assert conn.busy
        assert len(conn._buf) < 512 * 1024
        served, tail = 0, b""
        while served < n:  # and all are served, in order, once the stream is done
            data = tail + await reader.read(1 << 20)
            served += data.count(b'{"status":"ok"}')
            tail = data[-14:]  # (shorter than the marker: nothing is counted twice)
        writer.close()

    run_cluster(t)


def test_connections_beyond_the_limit_get_503_and_are_closed() -> None:
    async def t(c: Cluster) -> None:
        held = [await asyncio.open_connection("127.0.0.1", c.port) for _ in range(3)]
        await asyncio.sleep(0.05)
        reader, writer = await asyncio.open_connection("127.0.0.1", c.port)
        raw = await asyncio.wait_for(reader.read(), 10)
        assert raw.startswith(b"HTTP/1.1 503")
        assert b"too many connections" in raw
        for _, w in held:
            w.close()
        for _ in range(100):
            if len(c.app.state.connections) < 3:
                break
            await asyncio.sleep(0.01)
        assert (await c.call("GET", "/health")).status == 200
        assert c.metric("kvpd_proxy_connections_refused_total") == 1

    run_cluster(t, max_connections=3)


# --- differential fuzz against h11 -------------------------------------------------------------
MATTERS = (b"host", b"content-length", b"transfer-encoding", b"content-type", b"authorization")


def h11_read(raw: bytes) -> Any:
    """("ok", method, target, headers that matter, body) | "rejected" | "incomplete"."""
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(raw)
    try:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            return "incomplete"
        assert isinstance(event, h11.Request)
        body = b""
        while True:
            e = conn.next_event()
            if e is h11.NEED_DATA:
                return "incomplete"
            if isinstance(e, h11.Data):
                body += e.data
            elif isinstance(e, h11.EndOfMessage):
                break
    except h11.RemoteProtocolError:
        return "rejected"
    headers = {n: v for n, v in event.headers if n in MATTERS}
    return ("ok", event.method, event.target, headers, body)


class _FakeTransport:
    def __init__(self) -> None:
        self.out = b""
        self.closed = False

    def write(self, data: bytes) -> None:
        self.out += data

    def close(self) -> None:
        self.closed = True

    abort = close

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def is_closing(self) -> bool:
        return self.closed


class _Everything(dict):  # type: ignore[type-arg]
    """Routes every (method, path) to one recording handler."""

    def __init__(self, handler: Any) -> None:
        super().__init__()
        self.handler = handler

    def get(self, key: Any, default: Any = None) -> Any:
        return self.handler


def kvpd_read(raw: bytes, loop: asyncio.AbstractEventLoop) -> Any:
    seen: list[Request] = []
    router = Router()
    router.sync = _Everything(lambda client, req: seen.append(req))
    conn = ClientConnection(ServerState(router, loop, limits=Limits()))
    transport = _FakeTransport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    conn.data_received(raw)
    if seen:
        req = seen[0]
        target = req.path + (b"?" + req.query if req.query else b"")
        headers = {n: v for n, v in req.headers.items() if n in MATTERS}
        return ("ok", req.method, target, headers, req.body)
    if transport.closed and transport.out.startswith(b"HTTP/1.1 "):
        return "rejected"
    return "incomplete"


def _mostly(valid: list[bytes], odd: list[bytes], weight: int = 6) -> st.SearchStrategy[bytes]:
    """Valid choices most of the time, so that accepted requests are generated too."""
    return st.sampled_from(valid * weight + odd)


_METHODS = _mostly([b"GET", b"POST"], [b"get", b"P@ST", b"", b"PO\tST", b"DELETE"], 15)
_TARGETS = _mostly(
    [b"/v1/completions", b"/health", b"/a?b=c"],
    [b"*", b"http://x/", b"/\x7f", b"/\xc3\xa9", b"", b"/a%20b", b"/a b"],
    15,
)
_VERSIONS = _mostly([b"HTTP/1.1"], [b"HTTP/1.0", b"HTTP/1.2", b"http/1.1", b"HTTP/2"], 40)
_NAMES = _mostly(
    [b"X-A", b"Content-Type", b"Authorization"],
    [b"Host", b"Content-Length", b"Transfer-Encoding", b"Bad Name", b"X\x00", b""],
    4,
)
_VALUES = _mostly(
    [b"x", b"application/json", b"Bearer t"],
    [b"2", b"0", b"02", b"2, 2", b"+2", b"-1", b"chunked", b"Chunked", b"chunked, identity",
     b"identity", b" padded ", b"\xff", b"a\x00b", b"", b"a\tb", b"\xc3\xa9", b"4"],
    2,
)  # fmt: skip
_SEPS = _mostly([b": ", b":"], [b" : ", b":\t", b":  "], 15)
_EOLS = _mostly([b"\r\n"], [b"\n", b"\r"], 100)
_PAYLOADS = st.sampled_from([b"", b"{}", b'{"a":1}', b"x" * 10])
_CHUNKINGS = st.sampled_from(
    [b"2\r\n{}\r\n0\r\nX-T: 1\r\n\r\n", b"0\r\n\r\n", b"2;ext=1\r\n{}\r\n0\r\n\r\n",
     b"02\r\n{}\r\n0\r\n\r\n", b"2\r\n{}XX0\r\n\r\n", b"-2\r\n{}\r\n0\r\n\r\n",
     b"2 \r\n{}\r\n0\r\n\r\n", b"z\r\n", b"2\r\n{}\r\n", b"1\r\n{}\r\n0\r\n\r\n"]
)  # fmt: skip


@st.composite
def raw_requests(draw: st.DrawFn) -> bytes:
    """A request with a framing that is mostly consistent, then bent in one of many ways."""
    eol = draw(_EOLS)
    line = draw(_METHODS) + b" " + draw(_TARGETS) + b" " + draw(_VERSIONS) + eol
    fields: list[tuple[bytes, bytes]] = []
    if draw(st.integers(0, 9)):
        fields.append((b"Host", b"x"))
    framing = draw(st.sampled_from(["length", "length", "chunked", "chunked", "none"]))
    payload = draw(_PAYLOADS)
    if framing == "length":
        value = str(len(payload)).encode()
        fields.append((b"Content-Length", value if draw(st.integers(0, 5)) else draw(_VALUES)))
        body = payload
    elif framing == "chunked":
        value = b"chunked" if draw(st.integers(0, 5)) else draw(_VALUES)
        fields.append((b"Transfer-Encoding", value))
        if draw(st.booleans()):
            body = (b"%x\r\n%s\r\n" % (len(payload), payload) if payload else b"") + b"0\r\n\r\n"
        else:
            body = draw(_CHUNKINGS)
    else:
        body = b""
    for _ in range(draw(st.integers(0, 3))):
        fields.append((draw(_NAMES), draw(_VALUES)))
    order = draw(st.permutations(range(len(fields))))
    head = b""
    for i in order:
        name, value = fields[i]
        head += name + draw(_SEPS) + value + draw(_EOLS)
        if draw(st.integers(0, 30)) == 0:
            head += b" folded" + draw(_EOLS)  # obsolete line folding
    return line + head + draw(_EOLS) + body


@settings(
    max_examples=400,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(raw_requests())
def test_differential_fuzz_against_h11(raw: bytes) -> None:
    loop = asyncio.new_event_loop()
    try:
        ours = kvpd_read(raw, loop)
    finally:
        loop.close()
    ref = h11_read(raw)
    if ref == "rejected":
        assert ours != "incomplete" or b"\r\n\r\n" not in raw, raw
        assert not isinstance(ours, tuple), (raw, ours)
    elif ref == "incomplete":
        assert not isinstance(ours, tuple), (raw, ours)  # a framing disagreement
    else:
        assert ours != "incomplete", (raw, ref)  # a framing disagreement
        if isinstance(ours, tuple):
            assert ours == ref, raw  # both accept: same method, target, headers and body


def test_fuzz_generator_reaches_both_verdicts() -> None:
    """The fuzz above is only worth something if it produces both accepted and rejected
    requests: check a fixed sample covers both, for kvpd and h11 alike."""
    loop = asyncio.new_event_loop()
    good = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"
    try:
        assert kvpd_read(good, loop)[0] == "ok"
        assert h11_read(good)[0] == "ok"
        assert kvpd_read(good, loop) == h11_read(good)
        bad = HOSTILE["two different CL"]
        assert kvpd_read(bad, loop) == "rejected"
        assert h11_read(bad) == "rejected"
        chunked = POST + b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n"
        assert kvpd_read(chunked, loop) == h11_read(chunked)
        assert json.loads(kvpd_read(chunked, loop)[4]) == {}
    finally:
        loop.close()
