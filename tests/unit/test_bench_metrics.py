"""The /metrics parser and phase deltas, on text scraped from real vLLM engines and the proxy."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from kvpd.bench import metrics as m
from kvpd.exec.local import LocalTransport
from kvpd.plan.value import Plan

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "bench"
GOLDEN = Path(__file__).resolve().parents[1] / "golden"


def _load(name: str) -> m.Samples:
    return m.parse((FIX / name).read_text())


def test_parse_real_engine_metrics() -> None:
    s = _load("metrics_single_after.txt")
    assert m.total(s, "vllm:prefix_cache_hits_total") == 2016.0
    assert m.total(s, "vllm:prompt_tokens_by_source_total", source="local_cache_hit") == 2016.0
    assert m.total(s, "vllm:prompt_tokens_by_source_total") == 4611.0  # all sources
    assert m.total(s, "vllm:request_success_total") == 40.0
    info = next(iter(s["vllm:cache_config_info"]))
    assert dict(info)["block_size"] == "32"
    assert m.total(s, "no_such_metric") == 0.0


def test_parse_tolerates_odd_lines() -> None:
    s = m.parse('# HELP x\nx 1\nbroken line\ny{a="q\\"uote"} 2.5 1700000000\nz{a="b"} NaNx\n')
    assert s["x"][()] == 1.0
    assert s["y"][(("a", 'q"uote'),)] == 2.5
    assert "z" not in s


def _snap(**files: str) -> m.Snapshot:
    return m.Snapshot(samples={k: _load(v) for k, v in files.items()})


def test_delta_of_the_measured_prefix_phase_shows_cache_hits() -> None:
    """Single engine, guide protocol: the measured phase hit the seeded prefixes."""
    t = [m.Target("mixed-0", "mixed", "http://x/metrics")]
    d = m.delta(t, _snap(**{"mixed-0": "metrics_single_mid.txt"}),
                _snap(**{"mixed-0": "metrics_single_after.txt"}))  # fmt: skip
    s = d.summary()
    assert s["mixed_requests"] == 20
    assert s["prefix_cache_hits"] == 1920  # 20 prompts x 96 seeded tokens (3 blocks of 32)
    assert s["local_cache_hit_tokens"] == 1920
    assert s["external_prefix_cache_hits"] == 0


def test_delta_of_a_real_pd_run() -> None:
    tgts = [
        m.Target("prefill-0", "prefill", "u"),
        m.Target("decode-0", "decode", "u"),
        m.Target("proxy", "proxy", "u"),
    ]
    before = _snap(**{"prefill-0": "metrics_pd_prefill_before.txt",
                      "decode-0": "metrics_pd_decode_before.txt",
                      "proxy": "metrics_pd_proxy_before.txt"})  # fmt: skip
    after = _snap(**{"prefill-0": "metrics_pd_prefill_after.txt",
                     "decode-0": "metrics_pd_decode_after.txt",
                     "proxy": "metrics_pd_proxy_after.txt"})  # fmt: skip
    s = m.delta(tgts, before, after).summary()
    assert s["prefill_requests"] == 40
    assert s["decode_requests"] == 40
    assert s["decode_kv_received_tokens"] == 1824  # ExampleConnector, seed phase
    assert s["proxy_requests"] == 40
    assert s["proxy_handoffs"] == 40  # ExampleConnector: prefill answers without kv params


def test_unreachable_target_is_reported_missing_and_counters_never_go_negative() -> None:
    t = [m.Target("decode-0", "decode", "http://x/metrics")]
    d = m.delta(t, m.Snapshot(errors={"decode-0": "connection refused"}), m.Snapshot())
    assert "connection refused" in d.missing["decode-0"]
    restarted = m.delta(
        t,
        _snap(**{"decode-0": "metrics_single_after.txt"}),
        _snap(**{"decode-0": "metrics_single_before.txt"}),
    )
    assert restarted.role_sum("decode", "requests") == 0


def test_targets_from_a_plan_and_a_real_scrape() -> None:
    plan = Plan.from_dict(json.loads((GOLDEN / "local" / "plan.json").read_text()))
    tg = m.targets(plan)
    assert [(t.name, t.role, t.url, t.host) for t in tg] == [
        ("prefill-0", "prefill", "http://127.0.0.1:18100/metrics", "localhost"),
        ("decode-0", "decode", "http://127.0.0.1:18200/metrics", "localhost"),
        ("proxy", "proxy", "http://127.0.0.1:18000/metrics", "localhost"),
    ]
    body = (FIX / "metrics_single_after.txt").read_bytes()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/metrics" else 404)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a: object) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    try:
        port = srv.server_address[1]
        live = [m.Target("e", "mixed", f"http://127.0.0.1:{port}/metrics", "here"),
                m.Target("gone", "decode", "http://127.0.0.1:9/metrics", "here")]  # fmt: skip
        snap = m.scrape(live, {"here": LocalTransport()}, timeout_s=2)
        assert m.total(snap.samples["e"], "vllm:prefix_cache_hits_total") == 2016.0
        assert snap.errors["gone"] == "connection refused"
    finally:
        srv.shutdown()
        srv.server_close()
