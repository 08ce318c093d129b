"""Failure diagnosis from logs (pure) and the HTTP health probe."""

from __future__ import annotations

import http.server
import threading

import pytest

from kvpd.exec.diagnose.causes import current_run, likely_cause, tail
from kvpd.exec.local import LocalTransport
from kvpd.exec.processes.health import probe
from kvpd.plan.value import HealthCheck


@pytest.mark.parametrize(
    "log,expect",
    [
        ("OSError: [Errno 98] Address already in use", "port clash"),
        ("RuntimeError: Failed to infer device type", "CUDA GPU"),
        ("torch.OutOfMemoryError: CUDA out of memory", "out of memory"),  # not a missing GPU
        ("RuntimeError: [enforce fail] Cannot allocate memory", "out of memory"),
        ("ModuleNotFoundError: No module named 'vllm_ascend'", "`vllm_ascend` is missing"),
        ("ModuleNotFoundError: No module named 'kvpd'", "from kvpd's node bundle"),
        ("No module named 'kvpd.connectors'", "import `kvpd.connectors` from kvpd's node bundle"),
        ("No module named 'kvpdx'", "`kvpdx` is missing"),
        ("launch.sh: line 3: vllm: command not found", "`vllm` is not installed"),
        ("bash: /opt/venv/bin/vllm: No such file or directory", "(/opt/venv/bin/vllm)"),
        ("aclrtSetDevice failed", "Ascend NPU"),
        ("all good, then silence", ""),
    ],
)
def test_likely_cause(log: str, expect: str) -> None:
    cause = likely_cause(f"INFO start\n{log}\n", name="decode-0", host="h1", ports=(8200,))
    assert (expect in cause) if expect else cause == ""


def test_only_the_current_run_counts() -> None:
    log = (
        "=== kvpd: d/p started 1 ===\nOSError: Address already in use\n"
        "=== kvpd: d/p started 2 ===\nModuleNotFoundError: No module named 'x'\n"
    )
    now = current_run(log)
    assert now.startswith("=== kvpd: d/p started 2")
    assert "Address" not in now
    assert "`x` is missing" in likely_cause(now, name="p", host="h")
    assert tail("a\nb\nc\n", 2) == ["b", "c"]


def test_probe_statuses() -> None:
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/health" else 503)
            self.end_headers()

        def log_message(self, *a: object) -> None:
            pass

    srv = http.server.HTTPServer(("127.0.0.1", 0), H)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    base = f"http://127.0.0.1:{srv.server_address[1]}"
    t = LocalTransport()
    try:
        assert probe(t, HealthCheck(f"{base}/health")).ok
        bad = probe(t, HealthCheck(f"{base}/other"))
        assert not bad.ok
        assert bad.detail == "HTTP 503, expected 200"
        assert probe(t, HealthCheck(f"{base}/other", expect_status=503)).ok
    finally:
        srv.shutdown()
        srv.server_close()
    refused = probe(t, HealthCheck(f"{base}/health"))
    assert not refused.ok
    assert refused.detail == "connection refused"
