"""GET /metrics/engines: the engines' own metrics through the proxy, each sample labelled with
its engine's role and name, one HELP/TYPE per family, an engine that does not answer said so;
engines' text is untrusted (only the text format's lines are kept)."""

from __future__ import annotations

import pytest

from kvpd.proxy.engine_metrics import merge, render
from kvpd.proxy.routing import Request
from kvpd.proxy.server import ClientConnection
from kvpd.testing.backend import StandInBackend
from tests.unit.proxy_cluster import Cluster, run_cluster

pytestmark = pytest.mark.timeout(30)

VLLM_TEXT = b"""# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} %d.0
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="tiny"} %d.0
# HELP vllm:e2e_request_latency_seconds Histogram of e2e request latency in seconds.
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{engine="0",le="0.3",model_name="tiny"} 1.0
vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf",model_name="tiny"} 2.0
vllm:e2e_request_latency_seconds_count{engine="0",model_name="tiny"} 2.0
vllm:e2e_request_latency_seconds_sum{engine="0",model_name="tiny"} 0.5
process_open_fds 12.0
"""


def _serve_metrics(backend: StandInBackend, text: bytes) -> None:
    def handler(client: ClientConnection, req: Request) -> None:
        client.send(200, text, b"text/plain; version=0.0.4; charset=utf-8")

    backend._router.add("GET", "/metrics", handler)


def test_the_engines_metrics_are_aggregated_under_their_names() -> None:
    async def t(c: Cluster) -> None:
        _serve_metrics(c.p[0], VLLM_TEXT % (1, 300))
        _serve_metrics(c.d[0], VLLM_TEXT % (2, 0))
        r = await c.call("GET", "/metrics/engines")
        assert r.status == 200
        assert r.headers["content-type"].startswith("text/plain")
        lines = r.body.decode().splitlines()
        assert lines.count("# TYPE vllm:num_requests_running gauge") == 1
        assert ('vllm:num_requests_running{role="prefill",backend="prefill-0",engine="0",'
                'model_name="tiny"} 1.0') in lines  # fmt: skip
        assert ('vllm:num_requests_running{role="decode",backend="decode-0",engine="0",'
                'model_name="tiny"} 2.0') in lines  # fmt: skip
        # a family's samples together (the text format's rule), buckets with their family
        i = lines.index("# TYPE vllm:e2e_request_latency_seconds histogram")
        family = [x for x in lines[i + 1 : i + 9] if x.startswith("vllm:e2e_")]
        assert len(family) == 8
        assert 'process_open_fds{role="decode",backend="decode-0"} 12.0' in lines
        assert 'kvpd_proxy_engine_metrics_up{role="decode",backend="decode-0"} 1' in lines
        assert "/metrics/engines" in (await c.call("GET", "/metrics")).body.decode()

    run_cluster(t)


def test_an_engine_without_metrics_is_reported_not_fatal() -> None:
    async def t(c: Cluster) -> None:
        _serve_metrics(c.d[0], VLLM_TEXT % (2, 0))  # the prefiller answers 404
        r = await c.call("GET", "/metrics/engines")
        assert r.status == 200
        text = r.body.decode()
        assert 'kvpd_proxy_engine_metrics_up{role="prefill",backend="prefill-0"} 0' in text
        assert 'role="prefill",backend="prefill-0",engine' not in text
        assert 'backend="decode-0",engine="0"' in text

    run_cluster(t)


def test_engine_text_is_checked_line_by_line() -> None:
    families: dict = {}
    merge(
        b'# HELP a_total A.\n# TYPE a_total counter\na_total{role="x",k="v"} 3\n'
        b"<script>\nb 1 1700000000000\nc{unclosed 1\n# just a comment\n\nd NaN\n",
        b'role="decode",backend="d0"',
        families,
    )
    text = render(families, [("decode", "d0", True)]).decode()
    assert 'a_total{role="decode",backend="d0",exported_role="x",k="v"} 3' in text
    assert 'b{role="decode",backend="d0"} 1 1700000000000' in text
    assert 'd{role="decode",backend="d0"} NaN' in text
    assert "<script>" not in text
    assert "unclosed" not in text
    assert "just a comment" not in text
