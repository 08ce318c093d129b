"""The local CPU deployment end to end: real prefill and decode vLLM, real KV hand-over, the
kvpd proxy in front, then faults. Tests share one deployment (see local_deploy.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.e2e.local_deploy import (
    REPO,
    complete,
    get_json,
    kvpd,
    kvpd_env,
    local_sets,
    metric,
    set_args,
)

pytestmark = pytest.mark.e2e

PROMPT = (
    "The quick brown fox jumps over the lazy dog and then runs away into the forest where it "
    "meets another fox that says hello to it and they become friends forever and ever more"
)


def test_greedy_output_through_proxy_equals_prefill_alone(local_deployment) -> None:
    status, via_proxy = complete(local_deployment.proxy, PROMPT + " one")
    assert status == 200, via_proxy
    status, alone = complete(local_deployment.prefill, PROMPT + " one")
    assert status == 200, alone
    assert via_proxy["choices"][0]["text"] == alone["choices"][0]["text"]
    assert via_proxy["usage"]["completion_tokens"] == 12


def test_decode_receives_kv_from_prefill(local_deployment) -> None:
    before = metric(
        local_deployment.decode, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer"
    )
    status, body = complete(local_deployment.proxy, PROMPT + " two, with a longer tail here")
    assert status == 200, body
    after = metric(
        local_deployment.decode, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer"
    )
    assert after - before >= 32  # at least one whole 32-token block came from prefill


def test_streaming_and_chat_through_proxy(local_deployment) -> None:
    import urllib.request

    body = json.dumps(
        {
            "model": "tiny",
            "prompt": PROMPT,
            "max_tokens": 5,
            "stream": True,
            "ignore_eos": True,
            "stream_options": {"include_usage": True},
        }
    )
    req = urllib.request.Request(
        local_deployment.proxy + "/v1/completions",
        data=body.encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        kind = r.headers.get("Content-Type", "")
        text = r.read().decode()
    assert kind.startswith("text/event-stream"), kind
    events = [e.removeprefix("data: ") for e in text.split("\n\n") if e.startswith("data: ")]
    assert events, text[-500:]
    assert events[-1] == "[DONE]", text[-500:]
    chunks = [json.loads(e) for e in events[:-1]]
    # vLLM may put several tokens in one event when the engine runs ahead of the API server
    # (a loaded machine), so the count of events is not the count of tokens: the usage is.
    text_out = "".join(ch["text"] for c in chunks for ch in c.get("choices") or [])
    assert text_out, text[-500:]
    usage = [c["usage"] for c in chunks if c.get("usage")]
    assert usage, text[-500:]
    assert usage[-1]["completion_tokens"] == 5, text[-500:]
    status, chat = get_json(
        local_deployment.proxy + "/v1/chat/completions",
        {
            "model": "tiny",
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": 4,
            "ignore_eos": True,
        },
    )
    assert status == 200
    assert chat["usage"]["completion_tokens"] == 4


def test_status_reports_every_process_healthy(local_deployment) -> None:
    r = kvpd("status", "--deployment", local_deployment.name, "--json")
    rows = json.loads(r.stdout)["processes"]
    assert {p["name"] for p in rows} == {"prefill-0", "decode-0", "proxy"}
    assert all(p["alive"] and p["healthy"] for p in rows), rows


def test_logs_of_a_process(local_deployment) -> None:
    r = kvpd("logs", "decode-0", "--deployment", local_deployment.name, "-n", "200")
    assert "kvpd" in r.stdout or "vllm" in r.stdout.lower()


def test_second_up_is_refused(local_deployment) -> None:
    r = kvpd("up", "local", "--yes", *local_deployment.args, check=False)
    assert r.returncode != 0
    assert "kvpd down" in (r.stdout + r.stderr)


@pytest.mark.breaks_local_deployment
def test_killed_decode_gives_a_clear_error(local_deployment) -> None:
    """Breaks the shared deployment on purpose, so it runs after the deployment's other users
    (tests/e2e/conftest.py); the fixture restarts it for any test after it."""
    state = local_deployment.state()
    dec = next(p for p in state["processes"] if p["name"] == "decode-0")
    os.killpg(dec["pgid"], signal.SIGKILL)
    t0 = time.monotonic()
    status, body = complete(local_deployment.proxy, PROMPT + " three")
    assert time.monotonic() - t0 < 60  # answers, does not hang
    assert status >= 500, body
    assert "decode" in str(body).lower()


def test_down_after_killed_up_leaves_nothing(tmp_path) -> None:
    from tests.e2e.local_deploy import engine_missing

    reason = engine_missing()
    if reason:
        pytest.skip(reason)
    name = "e2e-killed"
    sets = local_sets(name, 18610)
    kvpd("down", "--deployment", name, check=False)
    cmd = [sys.executable, "-m", "kvpd.cli.main", "up", "local", "--yes", *set_args(sets)]
    up = subprocess.Popen(
        cmd, cwd=REPO, env=kvpd_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    state_file = REPO / ".kvpd" / name / "state.json"

    deadline = time.monotonic() + 120
    pids: list[int] = []
    while time.monotonic() < deadline:  # kill `up` once the engines are started, not healthy
        if state_file.exists():
            try:
                procs = json.loads(state_file.read_text()).get("processes", [])
            except ValueError:
                procs = []
            pids = [p["pid"] for p in procs if p.get("pid")]
            if len(pids) >= 2:
                break
        time.sleep(0.2)
    up.kill()
    up.wait()
    assert len(pids) >= 2, "up never recorded its engines"
    r = kvpd("down", "--deployment", name)
    assert "stopped" in r.stdout or "Nothing" in r.stdout
    for pid in pids:
        assert not _alive(pid), f"pid {pid} still running after down"
    r = kvpd("down", "--deployment", name)  # idempotent
    assert r.returncode == 0


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
