"""`kvpd forward`'s relay: a loopback port here carried to a port of a host by its transport
(here the local transport; over SSH the bastion end-to-end test), with real HTTP through it."""

from __future__ import annotations

import http.server
import json
import threading
import urllib.request
from collections.abc import Iterator

import pytest

from kvpd.cli.forward_cmd import how_to_reach
from kvpd.errors import KvpdError
from kvpd.exec.forward import Forwarder, forwarder
from kvpd.exec.local import LocalTransport
from kvpd.testing.transport import FakeTransport


class _Echo(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the relay must carry several exchanges

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        out = json.dumps({"got": json.loads(body)}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *a: object) -> None:
        pass


@pytest.fixture
def upstream() -> Iterator[int]:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv.server_address[1]
    srv.shutdown()
    srv.server_close()


def test_requests_through_the_forward(upstream: int) -> None:
    fwd = forwarder(LocalTransport(), "127.0.0.1", upstream, 0)
    threading.Thread(target=fwd.serve_forever, daemon=True).start()
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        for i in range(3):
            req = urllib.request.Request(
                f"http://127.0.0.1:{fwd.port}/v1/completions", data=json.dumps({"i": i}).encode()
            )
            with opener.open(req, timeout=10) as resp:
                assert json.loads(resp.read()) == {"got": {"i": i}}
    finally:
        fwd.close()


def test_a_refused_upstream_is_reported_and_the_client_closed() -> None:
    errors: list[str] = []
    free = Forwarder(lambda: None, 0)
    dead = free.port
    free.close()
    fwd = forwarder(LocalTransport(), "127.0.0.1", dead, 0, on_error=errors.append)
    threading.Thread(target=fwd.serve_forever, daemon=True).start()
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with pytest.raises(OSError):
            opener.open(f"http://127.0.0.1:{fwd.port}/health", timeout=10)
        assert errors
        assert "refused" in errors[0]
        assert "Fix:" in errors[0]
    finally:
        fwd.close()


def test_a_busy_port_and_a_transport_without_streams() -> None:
    first = Forwarder(lambda: None, 0)
    try:
        with pytest.raises(KvpdError, match="Fix: choose another port with --port"):
            Forwarder(lambda: None, first.port)
    finally:
        first.close()
    with pytest.raises(KvpdError, match="carries no streams"):
        forwarder(FakeTransport(), "10.0.0.1", 8000, 0)


def test_up_says_where_the_proxy_is_and_how_to_reach_it() -> None:
    line = how_to_reach("http://10.216.0.11:8000", "p1", "ssh", "ucm")
    assert "(in the cluster, on p1)" in line
    assert "`kvpd forward ucm` serves it on http://127.0.0.1:8000" in line
    assert how_to_reach("http://127.0.0.1:8000", "localhost", "local", "x") == (
        "Proxy: http://127.0.0.1:8000"
    )
