"""Day-two operations on a real local deployment (1 prefill, 2 decoders, supervised decoders):
the canary of `up`, supervision after SIGKILL, rolling restarts under load with zero failed
requests, the proxy restarted under load, `diagnose` and the event log.

One deployment for the module (an `up` costs ~30 s); every test starts from a healthy one
(`_healthy` brings it back if a test broke it), so they pass in any order and alone.
"""

from __future__ import annotations

import json
import os
import signal
import tarfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

from kvpd.testing.clock import wait_for
from tests.e2e.local_deploy import REPO, engine_missing, get_json, kvpd, local_sets, set_args

pytestmark = pytest.mark.e2e

NAME, PORT = "e2e-day2", 18640
PROXY = f"http://127.0.0.1:{PORT}"
SETS = [
    *local_sets(NAME, PORT),
    "decode.instances=2",
    "hosts.localhost.devices=3",
    "decode.restart.policy=on-failure",
    "decode.restart.max_restarts=2",
    "decode.restart.backoff_s=0.5",
]
STATE = REPO / ".kvpd" / NAME


def _status() -> dict:
    r = kvpd("status", NAME, "--json", check=False)
    return json.loads(r.stdout) if r.returncode == 0 else {}


def _all_healthy(st: dict) -> bool:
    procs = st.get("processes", [])
    return bool(procs) and all(p["alive"] and p["healthy"] for p in procs)


@pytest.fixture(scope="module")
def _deployment():
    reason = engine_missing()
    if reason:
        pytest.skip(reason)
    kvpd("down", NAME, check=False)
    r = kvpd("up", "local", "--yes", *set_args(SETS))
    try:
        yield r.stdout
    finally:
        kvpd("down", NAME, check=False)


@pytest.fixture
def day2(_deployment: str) -> str:
    """The module's deployment, healthy (started again if a test left it broken)."""
    if not _all_healthy(_status()):
        kvpd("down", NAME, check=False)
        kvpd("up", "local", "--yes", *set_args(SETS))
    return _deployment


def _admin(path: str) -> dict:
    token = (STATE / "admin-token").read_text().strip()
    req = urllib.request.Request(PROXY + path, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def _complete(prompt: str = "Hello from the day-two test", timeout: float = 60) -> int:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 4, "temperature": 0}
    return get_json(PROXY + "/v1/completions", body, timeout=timeout)[0]


class Load:
    """Requests through the proxy, back to back, from 2 threads, until stopped."""

    def __init__(self) -> None:
        self.outcomes: Counter[str] = Counter()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,)) for i in range(2)]

    def _run(self, i: int) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            try:
                status = _complete(f"load {i} {n}: " + "tell me about kv caches " * 8)
                self.outcomes["ok" if status == 200 else f"http {status}"] += 1
            except urllib.error.URLError as e:
                refused = isinstance(e.reason, ConnectionRefusedError)
                self.outcomes["refused" if refused else f"error {e.reason}"] += 1
                time.sleep(0.05)
            except OSError as e:  # reset mid-response
                self.outcomes[f"error {e}"] += 1

    def served(self, more: int, since: int = 0) -> bool:
        """Wait until `more` requests beyond `since` succeeded (the load is flowing)."""
        return wait_for(lambda: self.outcomes["ok"] >= since + more, timeout_s=120, every_s=0.1)

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=120)


def test_up_ends_with_the_canary(day2: str) -> None:
    assert "P→D KV handover verified:" in day2
    assert "from prefill-0 to decode-" in day2
    events = json.loads(kvpd("status", NAME, "--events", "--json").stdout)["events"]
    canaries = [e for e in events if e["what"] == "canary"]
    assert canaries
    assert canaries[0]["data"]["ok"] is True
    # The token the orchestrator keeps: private, and nowhere in the state or the plan output.
    token_file = STATE / "admin-token"
    assert oct(token_file.stat().st_mode & 0o777) == "0o600"
    assert token_file.read_text().strip() not in (STATE / "state.json").read_text()


def test_sigkilled_decode_is_restarted_and_taken_back(day2: str) -> None:
    sup = next(p for p in _status()["processes"] if p["name"] == "decode-0")["supervisor"]
    assert sup is not None
    assert sup["state"] == "running"
    before = sup["restarts"]
    os.kill(sup["child_pid"], signal.SIGKILL)
    deadline = time.monotonic() + 180
    row: dict = {}
    while time.monotonic() < deadline:
        row = next(p for p in _status()["processes"] if p["name"] == "decode-0")
        if row["supervisor"]["restarts"] == before + 1 and row["healthy"]:
            break
        time.sleep(1)
    assert row["supervisor"]["restarts"] == before + 1, row
    assert row["healthy"], row
    assert row["supervisor"]["last_exit"] == "signal SIGKILL"
    while time.monotonic() < deadline:  # the proxy's own health check takes it back
        b = {x["backend"]: x for x in _admin("/admin/backends")["backends"]}["decode-0"]
        if b["healthy"] and b["circuit"] == "closed":
            break
        time.sleep(0.5)
    assert b["healthy"], b
    assert b["circuit"] == "closed", b
    assert all(_complete() == 200 for _ in range(4))
    table = kvpd("status", NAME).stdout
    assert "Restarts" in table
    assert "SIGKILL" in table


def test_rolling_restart_under_load_fails_no_request(day2: str) -> None:
    """Both decoders, one at a time, while requests keep coming: none fails."""
    with Load() as load:
        assert load.served(2), load.outcomes  # requests flow before the restart ...
        r = kvpd("restart", NAME, "decode", "--drain-timeout", "60")
        assert load.served(2, since=load.outcomes["ok"]), load.outcomes  # ... and after it
    assert r.stdout.count("restarted ") == 2, r.stdout
    assert "P→D KV handover verified:" in r.stdout
    assert load.outcomes["ok"] > 0, load.outcomes
    assert set(load.outcomes) == {"ok"}, load.outcomes
    events = json.loads(kvpd("status", NAME, "--events", "--json").stdout)["events"]
    restarts = [e["detail"].split()[0] for e in events if e["what"] == "restart"]
    assert restarts[-2:] == ["decode-0", "decode-1"]


def test_restarted_prefiller_hands_kv_over(day2: str) -> None:
    """Decoders take KV from the new prefiller (the canary after the restart proves it on the
    next request; the one prefiller means no load here: it cannot keep answering alone)."""
    r = kvpd("restart", NAME, "prefill-0")
    after = r.stdout.split("restarted prefill-0", 1)[1]
    assert "P→D KV handover verified:" in after
    assert "from prefill-0 to decode-" in after


def _running_on_engines() -> float:
    total = 0.0
    for port in (PORT + 100, PORT + 200, PORT + 201):
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
        for line in text.decode().splitlines():
            if line.startswith("vllm:num_requests_running"):
                total += float(line.rsplit(" ", 1)[1])
    return total


def test_proxy_restart_under_load_only_refuses(day2: str) -> None:
    with Load() as load:
        assert load.served(2), load.outcomes
        kvpd("restart", NAME, "proxy")
        assert load.served(2, since=load.outcomes["ok"]), load.outcomes  # the new proxy serves
    bad = {k: v for k, v in load.outcomes.items() if k not in ("ok", "refused")}
    assert load.outcomes["ok"] > 0, load.outcomes
    assert not bad, load.outcomes
    # no engine keeps requests the old proxy left behind
    assert wait_for(lambda: _running_on_engines() == 0, timeout_s=60, every_s=0.5)
    assert all(b["inflight"] == 0 for b in _admin("/admin/backends")["backends"])


def test_diagnose_archive_and_summary(day2: str) -> None:
    r = kvpd("diagnose", NAME)
    assert "decode-1" in r.stdout
    assert "healthy" in r.stdout
    archive = Path(r.stdout.split("Archive:", 1)[1].split()[0])
    assert archive.parent == STATE / "diagnose"
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        summary = next(n for n in names if n.endswith("summary.txt"))
        text = tar.extractfile(summary).read().decode()
        env = next(n for n in names if n.endswith("proxy/env.txt"))
        env_text = tar.extractfile(env).read().decode()
    assert "prefill-0 on localhost: healthy" in text
    assert any(n.endswith("hosts/localhost/facts.txt") for n in names)
    assert any(n.endswith("processes/decode-0/log.txt") for n in names)
    assert "KVPD_PROCESS=proxy" in env_text


def test_engine_that_keeps_failing_gives_up_and_status_shows_its_log(day2: str) -> None:
    """Kill decode-1 every time it comes back: after 2 restarts its supervisor gives up."""
    deadline = time.monotonic() + 120
    killed: set[int] = set()
    row: dict = {}
    while time.monotonic() < deadline:
        row = next(p for p in _status()["processes"] if p["name"] == "decode-1")
        sup = row["supervisor"]
        if sup["state"] == "failed":
            break
        pid = sup["child_pid"]
        if pid not in killed and sup["state"] == "running":
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            killed.add(pid)
        time.sleep(0.3)
    assert row["supervisor"]["state"] == "failed", row
    assert not row["alive"], row
    assert "2 restarts within" in row["supervisor"]["gave_up"]
    assert any("giving up" in ln for ln in row["log_tail"])
    assert "stopped restarting; the end of its log" in kvpd("status", NAME).stdout
