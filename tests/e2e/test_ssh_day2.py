"""Day-two operations over SSH on the test bed: supervision of an engine that crashed on its
host, and `kvpd diagnose` on a crashed deployment and on one whose `up` was killed half way.

The engines are fakes (fault injection; a CPU vLLM per host would take minutes): one serves
/health like a ready engine, the other never does. Plan, SSH transport, executor, supervisor
and diagnose are real.
"""

from __future__ import annotations

import json
import shutil
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvpd.exec.ssh import SSHTransport
from tests.e2e.test_ssh_faults import (
    PROFILE,
    SPREAD,
    busy,
    inventory,
    start_up,
    wait_for_records,
)
from tests.e2e.test_ssh_rehearsal import SHARED, UCM4_HOSTS, kvpd
from tests.testbed import Testbed

pytestmark = [pytest.mark.e2e, pytest.mark.ssh]

FAKE_READY = """#!{python}
# Fake vLLM for kvpd's day-two tests (fault injection): answers every GET with 200.
import http.server, sys
a = sys.argv
port = int(a[a.index("--port") + 1])
host = a[a.index("--host") + 1] if "--host" in a else "0.0.0.0"
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass
print("fake engine: serving on", host, port, flush=True)
http.server.ThreadingHTTPServer((host, port), H).serve_forever()
"""
SUPERVISED = [
    "--set", "decode.restart.policy=on-failure",
    "--set", "decode.restart.max_restarts=3",
    "--set", "decode.restart.backoff_s=0.5",
]  # fmt: skip


@pytest.fixture(scope="module")
def fakes() -> Iterator[dict[str, Path]]:
    d = SHARED / "day2"
    d.mkdir(parents=True, exist_ok=True)
    ready = d / "fake-vllm-ready"
    ready.write_text(FAKE_READY.format(python=sys.executable))
    never = d / "fake-vllm-never-healthy"
    never.write_text(
        f"#!{sys.executable}\nimport time\nprint('fake engine: still loading', flush=True)\n"
        "while True:\n    time.sleep(3600)\n"
    )
    for p in (ready, never):
        p.chmod(0o755)
    yield {"ready": ready, "never": never}
    shutil.rmtree(d, ignore_errors=True)


def _status(state_dir: Path) -> dict[str, dict]:
    r = kvpd(state_dir, "status", PROFILE, "--json")
    return {p["name"]: p for p in json.loads(r.stdout)["processes"]}


def _archive(stdout: str) -> tuple[list[str], str]:
    path = Path(stdout.split("Archive:", 1)[1].split()[0])
    with tarfile.open(path) as tar:
        names = tar.getnames()
        summary = tar.extractfile(next(n for n in names if n.endswith("summary.txt")))
        return names, summary.read().decode()


def test_crashed_engine_restarted_then_diagnosed(
    bed: Testbed, fakes: dict[str, Path], tmp_path: Path
) -> None:
    inv = inventory(tmp_path, bed, fakes["ready"], UCM4_HOSTS, health_timeout_s=60)
    state_dir = tmp_path / "state"
    hosts = list(UCM4_HOSTS.values())
    up = ["up", PROFILE, "--rehearse", "--inventory", str(inv), *SPREAD, *SUPERVISED,
          "--yes", "--skip-preflight", "--no-canary", "--grace", "5"]  # fmt: skip
    kvpd(state_dir, *up)
    try:
        st = _status(state_dir)
        sup = st["decode-0"]["supervisor"]
        assert sup["state"] == "running"
        assert st["prefill-0"]["supervisor"] is None
        d1 = SSHTransport(bed.spec(UCM4_HOSTS["d1"], name="d1"))
        try:
            assert d1.run(["kill", "-9", str(sup["child_pid"])]).ok
        finally:
            d1.close()
        deadline, row = time.monotonic() + 60, {}
        while time.monotonic() < deadline:
            row = _status(state_dir)["decode-0"]
            if row["supervisor"]["restarts"] == 1 and row["healthy"]:
                break
            time.sleep(0.5)
        assert row["supervisor"]["restarts"] == 1, row
        assert row["healthy"], row
        assert row["supervisor"]["last_exit"] == "signal SIGKILL"

        # An unsupervised engine crashes: diagnose names it, from every host.
        p1 = SSHTransport(bed.spec(UCM4_HOSTS["p1"], name="p1"))
        try:
            assert p1.run(["kill", "-9", str(st["prefill-0"]["pid"])]).ok
        finally:
            p1.close()
        r = kvpd(state_dir, "diagnose", PROFILE)
        names, summary = _archive(r.stdout)
        assert "prefill-0 on p1: exited" in summary, summary
        assert "decode-0 on d1: healthy" in summary, summary
        for h in UCM4_HOSTS:
            assert any(n.endswith(f"hosts/{h}/facts.txt") for n in names), names
        assert any(n.endswith("processes/decode-0/env.txt") for n in names)
        events = json.loads(kvpd(state_dir, "status", PROFILE, "--events", "--json").stdout)
        assert [e["what"] for e in events["events"]] == ["up", "supervisor-restart", "diagnose"]
    finally:
        r = kvpd(state_dir, "down", PROFILE, "--json", "--grace", "5", check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert busy(bed, hosts) == {}  # supervisors and their children alike


def test_diagnose_after_up_killed_half_way(
    bed: Testbed, fakes: dict[str, Path], tmp_path: Path
) -> None:
    inv = inventory(tmp_path, bed, fakes["never"], UCM4_HOSTS)
    state_dir = tmp_path / "state"
    proc = start_up(state_dir, inv)
    try:
        wait_for_records(state_dir, 4, proc)
    finally:
        proc.kill()
        proc.communicate()
    try:
        r = kvpd(state_dir, "diagnose", PROFILE)
        names, summary = _archive(r.stdout)
        assert "prefill-0 on p1: unhealthy" in summary, summary
        assert "proxy on" in summary, summary
        assert "never started" in summary, summary
        assert any(n.endswith("processes/decode-1/log.txt") for n in names)
    finally:
        kvpd(state_dir, "down", PROFILE, "--grace", "5", check=False)
    assert busy(bed, list(UCM4_HOSTS.values())) == {}
