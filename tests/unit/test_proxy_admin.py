"""The proxy's admin interface (drain and re-admit a backend; token or loopback only), what the
rest of the proxy reveals (no backend addresses, no secrets), how secrets reach it (file or
environment, never a flag), and its open-files limit."""

from __future__ import annotations

import asyncio
import json
import logging
import resource
from pathlib import Path

import pytest

from kvpd.proxy.app import raise_open_files
from kvpd.proxy.config import ADMIN_TOKEN_ENV, CLIENT_KEY_ENV, ProxyConfigError, parse_args
from tests.unit.proxy_cluster import CLIENT_AUTH, CLIENT_KEY, COMPLETION, Cluster, run_cluster

pytestmark = pytest.mark.timeout(60)

TOKEN = "0123456789abcdef0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def test_admin_refuses_anyone_without_the_token() -> None:
    async def t(c: Cluster) -> None:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
            r = await c.call("GET", "/admin/backends", headers=headers)
            assert r.status == 403
            assert "admin token" in r.json()["error"]["message"]
            r = await c.call("POST", "/admin/drain", {"backend": "decode-0"}, headers=headers)
            assert r.status == 403
        assert not c.app.decoders.backends[0].draining
        r = await c.call("GET", "/admin/backends", headers=AUTH)
        assert r.status == 200
        rows = {row["backend"]: row for row in r.json()["backends"]}
        assert rows["decode-0"]["address"] == f"127.0.0.1:{c.d[0].port}"  # only here

    run_cluster(t, admin_token=TOKEN)


def test_drain_waits_for_in_flight_requests_and_admit_takes_the_backend_back() -> None:
    async def t(c: Cluster) -> None:
        long = dict(COMPLETION, max_tokens=4)
        first = asyncio.ensure_future(c.call("POST", "/v1/completions", long))
        target = c.app.decoders.backends[0]
        while not any(b.inflight for b in c.app.decoders.backends):
            await asyncio.sleep(0.005)
        busy = next(b for b in c.app.decoders.backends if b.inflight)
        drain = asyncio.ensure_future(
            c.call("POST", "/admin/drain", {"backend": busy.name, "timeout": 10}, headers=AUTH)
        )
        while not busy.draining:
            await asyncio.sleep(0.005)
        assert not drain.done()  # waits for the in-flight request
        served = busy.requests
        for _ in range(3):  # meanwhile new requests go elsewhere
            assert (await c.call("POST", "/v1/completions", COMPLETION)).status == 200
        assert busy.requests == served
        r = await drain
        assert r.status == 200
        assert r.json()["drained"] is True
        assert r.json()["inflight"] == 0
        assert (await first).complete
        r = await c.call("POST", "/admin/admit", {"backend": busy.name}, headers=AUTH)
        assert r.status == 200
        assert r.json()["draining"] is False
        for _ in range(4):
            assert (await c.call("POST", "/v1/completions", COMPLETION)).status == 200
        assert busy.requests > served
        label = f'role="decode",backend="{busy.name}"'
        assert c.metric(f'kvpd_proxy_backend_transitions_total{{{label},to="drain"}}') == 1
        assert c.metric(f'kvpd_proxy_backend_transitions_total{{{label},to="admit"}}') == 1
        assert target in c.app.decoders.backends

    run_cluster(t, n_decode=2, decode_delay=0.3, admin_token=TOKEN)


def test_drain_is_bounded_and_names_are_checked() -> None:
    async def t(c: Cluster) -> None:
        c.d[0].hang = True
        stuck = asyncio.ensure_future(c.call("POST", "/v1/completions", COMPLETION))
        while not c.app.decoders.backends[0].inflight:
            await asyncio.sleep(0.005)
        drain = {"backend": "decode-0", "timeout": 0.2}
        r = await c.call("POST", "/admin/drain", drain, headers=AUTH)
        assert r.status == 200
        assert r.json()["drained"] is False
        assert r.json()["inflight"] == 1
        r = await c.call("POST", "/admin/drain", {"backend": "decode-9"}, headers=AUTH)
        assert r.status == 404
        assert "decode-0" in r.json()["error"]["message"]
        assert (await c.call("POST", "/admin/drain", {"nope": 1}, headers=AUTH)).status == 400
        for timeout in (-1, 10**400, [1], "x"):
            bad = {"backend": "decode-0", "timeout": timeout}
            assert (await c.call("POST", "/admin/drain", bad, headers=AUTH)).status == 400
        by_address = {"backend": f"127.0.0.1:{c.d[0].port}"}
        r = await c.call("POST", "/admin/admit", by_address, headers=AUTH)
        assert r.status == 200
        assert r.json()["backend"] == "decode-0"
        stuck.cancel()

    run_cluster(t, admin_token=TOKEN)


def test_nothing_else_reveals_backend_addresses_or_secrets() -> None:
    async def t(c: Cluster) -> None:
        await c.call("POST", "/v1/completions", COMPLETION, headers=CLIENT_AUTH)
        await c.d[1].stop()  # errors now mention decode-1
        for _ in range(3):
            await c.call("POST", "/v1/completions", COMPLETION, headers=CLIENT_AUTH)
        await c.app.health.wait_round()
        c.p[0].fail_status = 500
        texts = []
        for method, path in (("GET", "/metrics"), ("GET", "/healthcheck"), ("GET", "/health"),
                             ("GET", "/v1/models"), ("POST", "/v1/completions"),
                             ("POST", "/reset_prefix_cache"), ("GET", "/nope")):  # fmt: skip
            body = COMPLETION if path == "/v1/completions" else None
            r = await c.call(method, path, body, headers=CLIENT_AUTH)
            texts.append(json.dumps(r.headers) + r.body.decode())
        text = "\n".join(texts)
        for b in c.p + c.d:
            assert f":{b.port}" not in text
            assert f"{b.port}," not in text
        assert "decode-1" in text  # the public names are there instead
        assert TOKEN not in text
        assert "sk-secret" not in text
        assert CLIENT_KEY not in text

    run_cluster(t, n_decode=2, admin_token=TOKEN, api_key="sk-secret", client_key=CLIENT_KEY,
                health_interval=0.05)  # fmt: skip


# --- secrets and options -----------------------------------------------------------------------
def test_admin_token_from_a_private_file_or_the_environment(tmp_path: Path) -> None:
    f = tmp_path / "token"
    f.write_text(TOKEN + "\n")
    f.chmod(0o600)
    env = {"OPENAI_API_KEY": "sk-x", CLIENT_KEY_ENV: CLIENT_KEY}
    cfg = parse_args(["--admin-token-file", str(f)], environ=env)
    assert cfg.admin_token == TOKEN
    assert cfg.api_key == "sk-x"
    assert cfg.client_key == CLIENT_KEY
    assert TOKEN not in repr(cfg)
    assert "sk-x" not in repr(cfg)
    assert CLIENT_KEY not in repr(cfg)
    assert parse_args([], environ={ADMIN_TOKEN_ENV: TOKEN}).admin_token == TOKEN
    assert parse_args([], environ={}).admin_token == ""

    f.chmod(0o644)
    with pytest.raises(ProxyConfigError, match="mode 0644 lets other users .* `chmod 600 "):
        parse_args(["--admin-token-file", str(f)], environ={})
    f.chmod(0o600)
    f.write_text("short")
    with pytest.raises(ProxyConfigError, match="at least 32 printable"):
        parse_args(["--admin-token-file", str(f)], environ={})
    with pytest.raises(ProxyConfigError, match="cannot read it"):
        parse_args(["--admin-token-file", str(tmp_path / "missing")], environ={})
    with pytest.raises(SystemExit):  # never a flag: `ps` would show it
        parse_args(["--admin-token", TOKEN], environ={})


def test_every_option_has_one_default_and_is_checked() -> None:
    cfg = parse_args([], environ={})
    assert cfg.port == 8000
    assert cfg.prefillers == (("127.0.0.1", 8001),)
    assert cfg.read_timeout == 300.0
    assert cfg.breaker_failures == 3
    assert cfg.max_connections == 8192
    assert parse_args(["--log-level", "debug"], environ={}).log_level == "DEBUG"
    for flag, value in (("--client-timeout", "0"), ("--max-connections", "0"),
                        ("--breaker-failures", "0"), ("--drain-timeout", "-1")):  # fmt: skip
        with pytest.raises(ProxyConfigError, match=flag):
            parse_args([flag, value], environ={})


def test_open_files_limit_is_raised_and_a_short_one_is_reported(
    caplog: pytest.LogCaptureFixture,
) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        with caplog.at_level(logging.INFO, logger="kvpd.proxy"):
            limit, _ = raise_open_files(100)
            assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == limit
            assert hard == resource.RLIM_INFINITY or limit == hard
            assert "below --max-connections" not in caplog.text
            raise_open_files(limit)  # more streams than the limit holds: said plainly
            assert f"below --max-connections {limit}" in caplog.text
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
