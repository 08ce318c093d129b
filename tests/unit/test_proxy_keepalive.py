"""HTTP/1.0 and HTTP/1.1 connection semantics at the proxy's client side (what `ab -k` and
other HTTP/1.0 clients rely on): 1.0 closes unless the client asks for keep-alive, and then the
answer says `Connection: keep-alive` with a Content-Length; 1.1 keeps the connection unless the
client says close; an HTTP/1.0 client never gets chunked framing."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.unit.proxy_cluster import Cluster, run_cluster

pytestmark = pytest.mark.timeout(30)


def request(version: str, path: str = "/health", body: object = None, conn: str = "") -> bytes:
    data = b"" if body is None else json.dumps(body).encode()
    method = "GET" if body is None else "POST"
    lines = [f"{method} {path} HTTP/{version}", "Host: x"]
    if conn:
        lines.append(f"Connection: {conn}")
    if body is not None:
        lines += ["Content-Type: application/json", f"Content-Length: {len(data)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + data


async def response(reader: asyncio.StreamReader) -> tuple[bytes, dict[bytes, bytes], bytes]:
    """One response with a Content-Length body: (status line, headers, body)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    status, *lines = head[:-4].split(b"\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (h.partition(b":") for h in lines)}
    body = await reader.readexactly(int(headers[b"content-length"]))
    return status, headers, body


async def closed(reader: asyncio.StreamReader) -> bool:
    try:
        return await asyncio.wait_for(reader.read(), 2) == b""
    except TimeoutError:
        return False


@pytest.mark.parametrize(
    ("version", "conn", "kept"),
    [("1.0", "", False), ("1.0", "keep-alive", True), ("1.0", "Keep-Alive", True),
     ("1.1", "", True), ("1.1", "close", False), ("1.1", "keep-alive, close", False)],
)  # fmt: skip
def test_connection_semantics(version: str, conn: str, kept: bool) -> None:
    async def t(c: Cluster) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", c.port)
        for path, body in (("/health", None), ("/v1/completions", {"prompt": "x"})):
            writer.write(request(version, path, body, conn))
            status, headers, _ = await response(reader)
            assert status.split()[1] == b"200"
            if version == "1.0" and kept:
                assert headers[b"connection"].lower() == b"keep-alive"
            if not kept:
                assert headers[b"connection"] == b"close"
                assert await closed(reader)
                break
            if version == "1.1":
                assert b"connection" not in headers
        else:
            assert not await closed(reader)
        writer.close()

    run_cluster(t)


def test_an_http10_client_gets_a_stream_unchunked_and_then_the_close() -> None:
    async def t(c: Cluster) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", c.port)
        body = {"prompt": "x", "stream": True}
        writer.write(request("1.0", "/v1/completions", body, "keep-alive"))
        raw = await asyncio.wait_for(reader.read(), 5)  # the server closes: the body's end
        head, _, payload = raw.partition(b"\r\n\r\n")
        assert b"transfer-encoding" not in head.lower()
        assert b"connection: close" in head
        events = [e for e in payload.split(b"\n\n") if e]
        assert events[-1] == b"data: [DONE]"
        assert len(events) == 5
        assert all(e.startswith(b"data: ") for e in events)
        writer.close()

    run_cluster(t)


def test_http10_expect_gets_no_interim_response() -> None:
    async def t(c: Cluster) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", c.port)
        data = json.dumps({"prompt": "x"}).encode()
        writer.write(
            b"POST /v1/completions HTTP/1.0\r\nExpect: 100-continue\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(data)
        )
        await asyncio.sleep(0.2)
        writer.write(data)
        raw = await asyncio.wait_for(reader.read(), 5)
        assert raw.startswith(b"HTTP/1.1 200")
        assert b"100 Continue" not in raw
        writer.close()

    run_cluster(t)
