"""One contract for every transport: the local one, the scripted fake and SSH on the test bed
(`-m ssh`). What the executor relies on is asserted here once, so the fake cannot drift from
the real transports."""

from __future__ import annotations

import signal
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kvpd.errors import KvpdError
from kvpd.exec.local import LocalTransport
from kvpd.exec.processes import sweep
from kvpd.exec.transport import ChannelError, HttpRequest, HttpResponse, Started, Transport
from kvpd.testing.clock import free_port, wait_for
from kvpd.testing.transport import Answer, FakeProgram, FakeTransport

# Listens on argv[1] and says so; with argv[2] == "stubborn" it ignores SIGTERM.
LISTENER = (
    "import signal, socket, sys, time\n"
    "if sys.argv[2:] == ['stubborn']: signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind(('0.0.0.0', int(sys.argv[1]))); s.listen()\n"
    "print('listening', flush=True); time.sleep(600)\n"
)

# Answers "METHOD PATH BODY" on 127.0.0.1:argv[1] of its host (404 for /missing), with a
# Content-Length, as the engines' and the proxy's servers do.
ECHO_SERVER = (
    "import http.server, sys\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    def answer(self):\n"
    "        n = int(self.headers.get('Content-Length') or 0)\n"
    "        out = f'{self.command} {self.path} '.encode() + self.rfile.read(n)\n"
    "        self.send_response(404 if self.path == '/missing' else 200)\n"
    "        self.send_header('Content-Length', str(len(out)))\n"
    "        self.end_headers(); self.wfile.write(out)\n"
    "    do_GET = do_POST = answer\n"
    "    def log_message(self, *a): pass\n"
    "s = http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), H)\n"
    "print('listening', flush=True); s.serve_forever()\n"
)


def echo(req: HttpRequest) -> HttpResponse:
    """What ECHO_SERVER answers, for the fake."""
    out = f"{req.method} {req.path} ".encode() + (req.body or b"")
    return HttpResponse(404 if req.path == "/missing" else 200, out)


@dataclass
class Host:
    t: Transport
    workdir: str
    # Tell a fake what `python3 LISTENER port [stubborn]` does; real hosts just run it.
    script: Callable[[FakeProgram], None]
    # Tell a fake what a port answers over HTTP; real hosts answer by their processes.
    serve: Callable[[int, Answer], None] = lambda port, answer: None


@pytest.fixture(
    params=[
        "local",
        "fake",
        "container",
        pytest.param("ssh", marks=pytest.mark.ssh),
        pytest.param("ssh-container", marks=pytest.mark.ssh),
    ]
)
def host(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Host]:
    if request.param == "local":
        yield Host(LocalTransport(base_dir=str(tmp_path)), str(tmp_path), lambda p: None)
    elif request.param == "container":
        # The local host's commands run inside the namespace stand-in of a container runtime.
        from tests.unit.standin import standin_container

        with standin_container(LocalTransport(base_dir=str(tmp_path))) as t:
            yield Host(t, str(tmp_path), lambda p: None)
    elif request.param == "fake":
        fake = FakeTransport()
        yield Host(fake, "/home/fake/work", lambda p: fake.script("python3", p), fake.serve)
    else:
        from kvpd.exec.ssh import SSHTransport
        from tests.unit.standin import standin_container

        bed = request.getfixturevalue("testbed")
        t = SSHTransport(bed.spec("h1"))
        work = f"/tmp/kvpd-contract-{uuid.uuid4().hex[:8]}"
        assert t.run(["mkdir", "-p", work]).ok
        try:
            if request.param == "ssh-container":  # the stand-in on a bed host, over SSH
                with standin_container(t) as c:
                    yield Host(c, work, lambda p: None)
            else:
                yield Host(t, work, lambda p: None)
        finally:
            t.run(["rm", "-rf", "--", work])
            t.close()


def test_files_round_trip_and_resolve(host: Host) -> None:
    t = host.t
    path = f"{host.workdir}/sub/f.txt"
    t.put(path, b"one\x00two\n", mode=0o600)
    assert t.read(path) == b"one\x00two\n"
    t.put(path, b"replaced")  # atomic replace
    assert t.read(path) == b"replaced"
    with pytest.raises(FileNotFoundError):
        t.read(f"{host.workdir}/missing")
    assert t.resolve("rel/x").startswith("/")
    assert t.resolve("rel/x").endswith("/rel/x")


def test_append_creates_then_extends_a_file(host: Host) -> None:
    t = host.t
    path = f"{host.workdir}/logs/new/p.log"  # the parents do not exist yet
    t.append(path, "=== header $(id) '\"\n")
    t.append(path, "more")
    assert t.read(path) == b"=== header $(id) '\"\nmore"
    t.put(f"{host.workdir}/kept", b"a\n")
    t.append(f"{host.workdir}/kept", "b\n")
    assert t.read(f"{host.workdir}/kept") == b"a\nb\n"


def test_commands_report_exit_codes(host: Host) -> None:
    t = host.t
    assert t.run(["true"]).ok
    assert t.run(["false"]).exit_code == 1
    assert t.run(["kvpd-no-such-command-xyz"]).exit_code == 127
    t.put(f"{host.workdir}/log", b"a\nb\nc\n")
    r = t.run(["tail", "-n", "2", f"{host.workdir}/log"])
    assert r.ok
    assert r.stdout == "b\nc\n"
    with pytest.raises(KvpdError):
        t.run(["true"], env={"NOT A NAME": "x"})


def test_detached_process_lifecycle_and_pid_reuse_guard(host: Host) -> None:
    t, port = host.t, free_port()
    host.script(FakeProgram(output="listening\n", ports=(port,)))
    log = f"{host.workdir}/logs/listener.log"
    s = t.start_detached(["python3", "-c", LISTENER, str(port)], log=log, cwd=host.workdir)
    assert s.pid == s.pgid
    assert s.start_ticks > 0
    assert wait_for(lambda: t.ports_listening([port, 1]) == [port])
    assert t.alive(s.pid)
    assert t.alive(s.pid, start_ticks=s.start_ticks)
    assert not t.alive(s.pid, start_ticks=s.start_ticks + 1)  # another process by that PID
    assert not t.signal_group(s.pgid, signal.SIGTERM, start_ticks=s.start_ticks + 1)
    assert s.pid in t.group_alive(s.pgid)
    assert b"listening" in t.read(log)
    assert t.signal_group(s.pgid, signal.SIGTERM, start_ticks=s.start_ticks)
    assert wait_for(lambda: not t.alive(s.pid) and t.group_alive(s.pgid) == [])
    assert not t.signal_group(s.pgid, signal.SIGTERM, start_ticks=s.start_ticks)
    assert wait_for(lambda: t.ports_listening([port]) == [])


def test_sigterm_ignored_needs_sigkill(host: Host) -> None:
    t, port = host.t, free_port()
    host.script(FakeProgram(output="listening\n", ports=(port,), ignore_term=True))
    log = f"{host.workdir}/stubborn.log"
    argv = ["python3", "-c", LISTENER, str(port), "stubborn"]
    s = t.start_detached(argv, log=log, cwd=host.workdir)
    assert wait_for(lambda: t.ports_listening([port]) == [port])
    assert t.signal_group(s.pgid, signal.SIGTERM, start_ticks=s.start_ticks)
    time.sleep(0.3)
    assert t.alive(s.pid, start_ticks=s.start_ticks)
    assert t.signal_group(s.pgid, signal.SIGKILL, start_ticks=s.start_ticks)
    assert wait_for(lambda: not t.alive(s.pid))


def test_starting_a_missing_program_fails_loudly(host: Host) -> None:
    with pytest.raises((KvpdError, OSError)):
        host.t.start_detached(
            ["kvpd-no-such-command-xyz"], log=f"{host.workdir}/x.log", cwd=host.workdir
        )


def test_what_kvpd_creates_is_private_from_the_start(host: Host) -> None:
    t = host.t
    if isinstance(t, FakeTransport):
        pytest.skip("the fake has no permissions")

    def mode(path: str) -> str:
        r = t.run(["stat", "-c", "%a", path])
        assert r.ok, r.stderr
        return r.stdout.strip()

    t.put(f"{host.workdir}/new/sub/token", b"secret", mode=0o600)
    assert [mode(f"{host.workdir}/{p}") for p in ("new", "new/sub", "new/sub/token")] == [
        "700",
        "700",
        "600",
    ]
    t.append(f"{host.workdir}/appended/sub/p.log", "header\n")
    assert [mode(f"{host.workdir}/{p}") for p in ("appended", "appended/sub/p.log")] == [
        "700",
        "600",
    ]
    log = f"{host.workdir}/newlogs/p.log"
    s = t.start_detached(["sleep", "5"], log=log, cwd=host.workdir)
    try:
        assert (mode(f"{host.workdir}/newlogs"), mode(log)) == ("700", "600")
    finally:
        t.signal_group(s.pgid, signal.SIGKILL, start_ticks=s.start_ticks)


def test_a_secret_in_env_reaches_the_command(host: Host) -> None:
    if isinstance(host.t, FakeTransport):
        pytest.skip("the fake runs no shell")
    token = 'hf_x\'; $(id) "y"'
    r = host.t.run(["sh", "-c", 'printf %s "$HF_TOKEN"'], env={"HF_TOKEN": token, "A": "1"})
    assert r.ok
    assert r.stdout == token


def test_http_to_a_port_as_the_host_sees_it(host: Host) -> None:
    """Transport.http reaches 127.0.0.1 of the host itself (over SSH: a channel of the host's
    connection, so only its sshd need be reachable), any status is an answer, and a port
    nothing listens on is refused, as such."""
    t, port = host.t, free_port()
    host.script(FakeProgram(output="listening\n", ports=(port,)))
    host.serve(port, echo)
    log = f"{host.workdir}/echo.log"
    s = t.start_detached(["python3", "-c", ECHO_SERVER, str(port)], log=log, cwd=host.workdir)
    try:
        assert wait_for(lambda: t.ports_listening([port]) == [port])
        got = t.http(HttpRequest("GET", "127.0.0.1", port, "/health?x=1", timeout_s=5))
        assert (got.status, got.body) == (200, b"GET /health?x=1 ")
        body = b'{"a": 1}'
        got = t.http(HttpRequest("POST", "127.0.0.1", port, "/v1/x", body, timeout_s=5))
        assert (got.status, got.body) == (200, b"POST /v1/x " + body)
        assert t.http(HttpRequest("GET", "127.0.0.1", port, "/missing")).status == 404
    finally:
        t.signal_group(s.pgid, signal.SIGKILL, start_ticks=s.start_ticks)
    assert wait_for(lambda: t.ports_listening([port]) == [])
    host.serve(port, lambda req: (_ for _ in ()).throw(ChannelError("refused", "x", "x")))
    with pytest.raises(ChannelError) as e:
        t.http(HttpRequest("GET", "127.0.0.1", port, "/health", timeout_s=5))
    assert e.value.kind == "refused"


def test_a_started_process_is_found_by_its_deployment_marks(host: Host) -> None:
    """What `down` finds when no record names a process: the sessions whose environment names
    the deployment and that run in its run dir; not another deployment's, nor one elsewhere."""
    t = host.t
    host.script(FakeProgram(output="sleeping\n"))
    dep = f"dep-{uuid.uuid4().hex[:6]}"
    run_dir, other = f"{host.workdir}/run", f"{host.workdir}/other"
    assert t.run(["mkdir", "-p", run_dir, other]).ok

    def start(cwd: str, env: dict[str, str]) -> Started:
        argv = ["python3", "-c", "import time; time.sleep(600)"]
        return t.start_detached(argv, log=f"{host.workdir}/sleep.log", cwd=cwd, env=env)

    marks = {sweep.DEPLOYMENT_ENV: dep, sweep.PROCESS_ENV: "prefill-0"}
    started = [
        start(run_dir, marks),
        start(other, marks),  # the deployment's name, another directory
        start(run_dir, {**marks, sweep.DEPLOYMENT_ENV: dep + "x"}),  # another deployment
        start(run_dir, {}),
    ]
    try:
        ours = started[0]
        found: list[sweep.Marked] = []

        def named() -> bool:
            # A launcher (pyenv's python3 shim) execs and forks short-lived children before
            # the command runs: a process read mid-exec, or that exits while listed, keeps its
            # stat but not its name ("?"). Listed again until the leader is named.
            found[:] = sweep.list_marked(t, dep, run_dir)
            return ("prefill-0", ours.pid, ours.start_ticks) in {
                (m.name, m.stat.pid, m.stat.start_ticks) for m in found
            }

        assert wait_for(named)
        # Its session only (a container runtime's wrapper may be its leader, with a child).
        assert {(m.stat.pgid, m.stat.sid) for m in found} == {(ours.pgid, ours.pgid)}
        assert sweep.list_marked(t, dep, f"{host.workdir}/missing") == []
    finally:
        for s in started:
            t.signal_group(s.pgid, signal.SIGKILL, start_ticks=s.start_ticks)
