"""Every exchange with a cluster port goes through the host's transport: the HTTP wire format,
the precise error for each way a channel fails, the health probe on top, and preflight's
channel check. The SSH channel itself runs in test_transport_contract.py (bed) and the
bastion end-to-end test."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvpd.errors import HealthTimeout
from kvpd.exec.channel_errors import refusal, unreachable
from kvpd.exec.executor import Executor
from kvpd.exec.http_wire import direct, encode, endpoint
from kvpd.exec.preflight.channels import check_host
from kvpd.exec.processes.health import probe
from kvpd.exec.proxy_admin import ProxyAdmin
from kvpd.exec.state import StateStore
from kvpd.exec.transport import ChannelError, HttpRequest, HttpResponse
from kvpd.plan.value import FileSpec, HealthCheck, HostSpec, Plan, ProcessSpec
from kvpd.testing.transport import FakeProgram, FakeTransport


def test_the_forbidden_channel_names_sshd_and_the_fix() -> None:
    e = refusal("p1", "kvpd", "10.0.0.1", 7800, 1, "open failed", own=True)
    assert e.kind == "forbidden"
    assert "channel refused by p1's sshd (AllowTcpForwarding no?)" in str(e)
    assert "Fix: allow TCP forwarding for kvpd in p1's sshd_config" in str(e)


def test_a_refused_port_says_the_channel_opened() -> None:
    e = refusal("p1", "root", "10.0.0.1", 7800, 2, "Connect failed", own=True)
    assert e.kind == "refused"
    assert e.detail == "port 7800 refused (the SSH channel to p1 opened)"
    assert str(e).startswith("host p1: the SSH channel to p1 opened, port 7800 refused")
    assert "Fix: check that the process runs" in str(e)


def test_another_address_the_host_cannot_connect_to() -> None:
    e = refusal("p1", "root", "10.9.9.9", 7800, 2, "Connect failed", own=False)
    assert e.kind == "unreachable"
    assert e.detail == "p1 cannot connect to 10.9.9.9:7800"
    assert "sshd does not say which" in str(e)
    assert "Fix:" in str(e)


def test_an_unreachable_host() -> None:
    e = unreachable("p1", OSError("host p1: cannot connect: No route to host. Fix: check it"))
    assert e.kind == "unreachable"
    assert e.detail == "p1 unreachable"
    assert str(e).startswith("p1 unreachable: host p1: cannot connect")
    assert "Fix:" in str(e)


def test_a_request_is_one_exchange_and_refuses_header_injection() -> None:
    req = endpoint("http://10.0.0.1:7800/base", "/v1/completions").request(
        "POST", body=b"{}", headers=(("Authorization", "Bearer t"),)
    )
    assert (req.address, req.port, req.path) == ("10.0.0.1", 7800, "/base/v1/completions")
    wire = encode(req)
    assert wire.startswith(b"POST /base/v1/completions HTTP/1.1\r\nHost: 10.0.0.1:7800\r\n")
    assert b"Content-Length: 2\r\nAuthorization: Bearer t\r\n\r\n{}" in wire
    assert endpoint("http://[::1]:8000/health?x=1").path == "/health?x=1"
    for bad in ({"path": "/a\r\nX: y"}, {"headers": (("A", "b\nc"),)}, {"port": 0}):
        with pytest.raises(ValueError, match="malformed HTTP request"):
            HttpRequest(**{"method": "GET", "address": "a", "port": 80, "path": "/", **bad})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not an http"):
        endpoint("https://10.0.0.1/x")


@pytest.fixture
def server() -> Iterator[tuple[int, list[bytes]]]:
    """A TCP server answering each connection with the next scripted bytes (b"" = stall)."""
    answers: list[bytes] = []
    srv = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                data = answers.pop(0) if answers else b""
                if data:
                    conn.sendall(data)
                else:
                    stop.wait(3)

    threading.Thread(target=serve, daemon=True).start()
    yield srv.getsockname()[1], answers
    stop.set()
    srv.close()


def test_the_wire_reads_chunked_and_sized_answers(server: tuple[int, list[bytes]]) -> None:
    port, answers = server
    answers += [
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
        b"HTTP/1.1 503 Busy\r\nContent-Length: 4\r\n\r\nbusy",
    ]
    req = HttpRequest("GET", "127.0.0.1", port, "/x", timeout_s=2)
    assert direct(req, "h") == HttpResponse(200, b"abcde")
    assert direct(req, "h") == HttpResponse(503, b"busy")


def test_garbage_and_silence_are_failures_of_their_own(server: tuple[int, list[bytes]]) -> None:
    port, answers = server
    answers += [b"SSH-2.0-OpenSSH_9.2\r\n", b""]
    req = HttpRequest("GET", "127.0.0.1", port, "/x", timeout_s=0.5)
    with pytest.raises(ChannelError) as e:
        direct(req, "h")
    assert e.value.kind == "bad-answer"
    assert "gave no valid HTTP answer" in str(e.value)
    with pytest.raises(ChannelError) as e:
        direct(req, "h")
    assert e.value.kind == "timeout"
    assert e.value.detail == "timed out after 0.5s"


def test_probes_go_through_the_hosts_transport() -> None:
    """No socket is opened here: the fake host answers, refuses, or forbids the channel."""
    t = FakeTransport("p1")
    check = HealthCheck("http://10.0.0.1:7800/health")
    t.serve(7800, HttpResponse(200, b"ok"))
    assert probe(t, check).ok
    assert t.requests[-1].address == "10.0.0.1"
    t.answers.clear()
    assert probe(t, check).detail == "port 7800 refused (the SSH channel to p1 opened)"
    t.forwarding = False
    assert "AllowTcpForwarding no?" in probe(t, check).detail
    t.unreachable = True
    assert probe(t, check).detail == "p1 unreachable"


def test_up_fails_with_where_the_probe_broke(tmp_path: Path) -> None:
    t = FakeTransport("p1")
    t.script("e.sh", FakeProgram(output="up\n"))
    health = HealthCheck("http://10.0.0.1:7800/health", timeout_s=5, interval_s=1)
    plan = Plan("d", "x", (HostSpec("p1", "10.0.0.1", run_dir="run"),),
                (FileSpec("p1", "e.sh", "exec engine\n"),),
                (ProcessSpec("e", "p1", "prefill", 0, "e.sh", ("engine",), ports=(7800,),
                             health=health, log="logs/e.log"),))  # fmt: skip
    now = [0.0]
    ex = Executor({"p1": t}, store=StateStore(tmp_path), clock=lambda: now[0],
                  sleep=lambda s: now.__setitem__(0, now[0] + max(s, 1)))  # fmt: skip
    with pytest.raises(HealthTimeout) as e:
        ex.up(plan)
    assert "GET http://10.0.0.1:7800/health -> port 7800 refused (the SSH channel to p1" in str(
        e.value
    )


def test_preflight_checks_each_host_can_open_a_channel() -> None:
    t = FakeTransport("p1")
    assert check_host("p1", t).ok
    t.forwarding = False
    c = check_host("p1", t)
    assert not c.ok
    assert "AllowTcpForwarding no?" in c.detail
    assert c.fix.startswith("allow TCP forwarding for fake in p1's sshd_config")
    assert "`AllowTcpForwarding local`" in c.fix


def test_proxy_admin_calls_through_the_proxy_host() -> None:
    t = FakeTransport("px")
    t.serve(8000, lambda r: HttpResponse(200, b'{"backends": [{"backend": "prefill-0"}]}'))
    admin = ProxyAdmin(t, "http://10.0.0.5:8000", "tok")
    assert admin.backends() == [{"backend": "prefill-0"}]
    sent = t.requests[-1]
    assert (sent.address, sent.path) == ("10.0.0.5", "/admin/backends")
    assert ("Authorization", "Bearer tok") in sent.headers


def test_paramikos_own_line_for_a_refused_channel_is_not_printed() -> None:
    """kvpd reports a refused channel with its fix; paramiko's ERROR line would be printed on
    stderr (Python's last-resort handler) on every probe of a waiting `up`."""
    import logging

    import kvpd.exec.ssh.channels  # noqa: F401  (installs the filter)

    log = logging.getLogger("paramiko.transport")
    failed = log.makeRecord(log.name, logging.ERROR, __file__, 1,
                            "Secsh channel 3 open FAILED: Connection refused: Connect failed",
                            (), None)  # fmt: skip
    other = log.makeRecord(log.name, logging.ERROR, __file__, 1, "Socket exception", (), None)
    assert not log.filter(failed)
    assert log.filter(other)


def test_preflight_fails_a_host_whose_sshd_opens_no_channel_in_time() -> None:
    """A channel sshd never opens would stall every probe too: a failed check with its fix,
    not a pass."""

    class Stalled(FakeTransport):
        def http(self, req: HttpRequest) -> HttpResponse:
            raise ChannelError("timeout", "no channel within 10s", "host p1: ... (timed out)")

    c = check_host("p1", Stalled("p1"))
    assert not c.ok
    assert c.detail == "no channel within 10s"
    assert "sshd" in c.fix
