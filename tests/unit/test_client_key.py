"""The proxy's client key from profile to proxy, canary and bench: the profile names a private
file on the controller (never the key), `up` copies it to the proxy's host 0600, the canary
sends it; a backend key without it is refused; credentials never follow a redirect."""

from __future__ import annotations

import http.server
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvpd.bench import canary
from kvpd.errors import DeployError, ProfileError
from kvpd.exec import client_key
from kvpd.exec.local import LocalTransport
from kvpd.exec.proxy_admin import ProxyAdmin
from kvpd.plan.build import load_plan
from kvpd.plan.value import HostSpec, Plan

KEY = "k" * 16 + "0123456789abcdef"


def plan(*sets: str) -> Plan:
    return load_plan("local", sets=list(sets), base_dir="/srv/kvpd")


def key_file(tmp_path: Path, text: str = KEY + "\n", mode: int = 0o600) -> Path:
    f = tmp_path / "client-key"
    f.write_text(text)
    f.chmod(mode)
    return f


def test_a_backend_key_needs_a_client_key_in_the_profile() -> None:
    with pytest.raises(ProfileError) as e:
        plan("env.OPENAI_API_KEY=sk-backend")
    assert "env.OPENAI_API_KEY: OPENAI_API_KEY gives the proxy a key for the engines" in str(
        e.value
    )
    assert "proxy.client_key_file" in str(e.value)
    with pytest.raises(ProfileError, match="must be an absolute path"):
        plan("proxy.client_key_file=keys/client")
    with pytest.raises(ProfileError, match="vLLM-Ascend's example proxy cannot check"):
        plan("proxy.impl=vllm-ascend", "proxy.client_key_file=/k", "hardware=a2")


def test_the_plan_names_the_file_never_the_key(tmp_path: Path) -> None:
    f = key_file(tmp_path)
    p = plan("env.OPENAI_API_KEY=sk-backend", f"proxy.client_key_file={f}")
    argv = p.process("proxy").command
    assert argv[argv.index("--client-key-file") + 1] == "proxy/client-key"
    assert Plan.from_dict(json.loads(p.to_json())).client_key_file == str(f)
    assert "client_key_file" not in plan().to_dict()  # plans without one keep their form
    executed = client_key.attach(p)
    spec = next(x for x in executed.files if x.path == "proxy/client-key")
    assert spec.content == KEY + "\n"
    assert spec.mode == 0o600
    assert spec.host == "localhost"
    assert KEY not in executed.to_json()
    assert KEY not in repr(executed)
    assert KEY not in " ".join(executed.process("proxy").command)
    assert client_key.attach(plan()) == plan()  # no client key: nothing added


@pytest.mark.parametrize(
    ("text", "mode", "message"),
    [
        (KEY, 0o644, "mode 0644, owner uid .* run `chmod 600"),
        ("short", 0o600, "at least 32 printable"),
        ("two words " * 4, 0o600, "without spaces"),
    ],
)
def test_a_key_file_must_be_private_and_hold_a_key(
    tmp_path: Path, text: str, mode: int, message: str
) -> None:
    f = key_file(tmp_path, text, mode)
    with pytest.raises(DeployError, match=message):
        client_key.read(plan(f"proxy.client_key_file={f}"))


def test_a_missing_or_linked_key_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(DeployError, match="cannot read it .*openssl rand -hex 32"):
        client_key.read(plan(f"proxy.client_key_file={tmp_path}/none"))
    link = tmp_path / "link"
    os.symlink(key_file(tmp_path), link)
    with pytest.raises(DeployError, match="cannot read it"):  # O_NOFOLLOW
        client_key.read(plan(f"proxy.client_key_file={link}"))


class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: list[dict[str, str]] = []
    target = ""

    def _answer(self) -> None:
        self.seen.append(dict(self.headers))
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        if self.target:  # the first server redirects to the second
            self.send_response(307)
            self.send_header("Location", self.target + self.path)
            self.end_headers()
            return
        body = json.dumps({"usage": {"completion_tokens": 1}, "backends": []}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def redirecting() -> Iterator[tuple[str, list[dict[str, str]]]]:
    """A server that redirects every request to a second one; the second one's headers."""
    second_seen: list[dict[str, str]] = []
    second = type("Second", (_Recorder,), {"seen": second_seen, "target": ""})
    s2 = http.server.HTTPServer(("127.0.0.1", 0), second)
    first = type(
        "First", (_Recorder,), {"seen": [], "target": f"http://127.0.0.1:{s2.server_port}"}
    )
    s1 = http.server.HTTPServer(("127.0.0.1", 0), first)
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in (s1, s2)]
    for t in threads:
        t.start()
    try:
        yield f"http://127.0.0.1:{s1.server_port}", second_seen
    finally:
        for s in (s1, s2):
            s.shutdown()
            s.server_close()


def test_credentials_never_follow_a_redirect(
    redirecting: tuple[str, list[dict[str, str]]],
) -> None:
    url, second_seen = redirecting
    here = LocalTransport(HostSpec("here", "127.0.0.1", transport="local"))
    with pytest.raises(ValueError, match="HTTP 307"):  # an answer like any other: not followed
        canary.send(here, url, "m", "hi", key=KEY, timeout_s=5)
    with pytest.raises(DeployError, match="HTTP 307"):
        ProxyAdmin(here, url, KEY, timeout_s=5).backends()
    assert second_seen == []  # neither the client key nor the admin token went elsewhere


def test_the_canary_sends_the_client_key() -> None:
    seen: list[dict[str, str]] = []
    handler = type("Direct", (_Recorder,), {"seen": seen, "target": ""})
    server = http.server.HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        here = LocalTransport(HostSpec("here", "127.0.0.1", transport="local"))
        url = f"http://127.0.0.1:{server.server_port}"
        assert canary.send(here, url, "m", "hi", key=KEY) == 1
    finally:
        server.shutdown()
        server.server_close()
    assert seen[0]["Authorization"] == f"Bearer {KEY}"


def test_the_bench_client_gets_the_key_in_its_environment_never_in_argv(tmp_path: Path) -> None:
    import dataclasses

    from kvpd.bench.session import Session
    from kvpd.bench.settings import make_settings
    from kvpd.exec.service import Deployments
    from kvpd.exec.state import StateStore
    from tests.unit.test_bench_proof import FIX, _fake_client, _MetricsServer, _plan

    seen: list[tuple[list[str], dict[str, str]]] = []
    fake = _fake_client("seed")

    def client(argv: list[str], *, env: dict[str, str], log: Path, timeout_s: float) -> Any:
        seen.append((list(argv), dict(env)))
        return fake(argv, env=env, log=log, timeout_s=timeout_s)

    def texts(role: str) -> list[str]:
        return [(FIX / f"metrics_pd_{role}_{t}.txt").read_text() for t in ("before", "after")]

    servers = {
        n: _MetricsServer(texts(n.split("-")[0])) for n in ("prefill-0", "decode-0", "proxy")
    }
    try:
        plan = dataclasses.replace(
            _plan({k: s.port for k, s in servers.items()}),
            client_key_file=str(key_file(tmp_path)),
        )
        Session(profile="fake-pd", settings=make_settings(plan.bench), scenarios=[],
                out_dir=tmp_path / "out", service=Deployments(StateStore(tmp_path / "state")),
                load=lambda sets: plan, vllm="vllm", run_client=client).run()  # fmt: skip
    finally:
        for s in servers.values():
            s.close()
    ((argv, env),) = seen
    assert env["OPENAI_API_KEY"] == KEY  # `vllm bench serve` sends it as its bearer token
    assert KEY not in " ".join(argv)
    logs = " ".join(p.read_text() for p in (tmp_path / "out").rglob("*") if p.is_file())
    assert KEY not in logs
