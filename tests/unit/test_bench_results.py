"""The parser of `vllm bench serve` output, against outputs saved from the real client."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvpd.bench import serve_output

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "bench"


@pytest.mark.parametrize("stem", ["measured", "seed"])
def test_stdout_block_matches_saved_json(stem: str) -> None:
    raw = json.loads((FIX / f"{stem}.json").read_text())
    printed = serve_output.parse_stdout((FIX / f"{stem}.stdout.txt").read_text())
    assert printed["completed"] == raw["completed"] == 20
    assert printed["failed"] == 0
    assert printed["max_concurrency"] == 4
    assert printed["total_input_tokens"] == raw["total_input_tokens"]
    for key in ("duration", "request_throughput", "output_throughput", "total_token_throughput"):
        assert printed[key] == pytest.approx(raw[key], abs=0.006), key
    for metric in ("ttft", "tpot", "itl", "e2el"):
        for stat in ("mean", "median", "p50", "p90", "p99"):
            key = f"{stat}_{metric}_ms"
            assert printed[key] == pytest.approx(raw[key], abs=0.006), key


def test_summarize_keeps_scalars_percentiles_and_kvpd_metadata() -> None:
    raw = json.loads((FIX / "pd_measured.json").read_text())
    s = serve_output.summarize(raw)
    assert s["completed"] == 20
    assert s["request_rate"] == "inf"
    assert s["kvpd_phase"] == "measured"
    assert s["kvpd_protocol"] == "prefix"
    assert {"mean_ttft_ms", "p99_e2el_ms", "p90_tpot_ms"} <= set(s)
    assert "latencies" not in s


def test_missing_keys_and_missing_block_are_tolerated() -> None:
    assert serve_output.parse_stdout("no result block here\n") == {}
    assert serve_output.summarize({"completed": 3}) == {"completed": 3}
    merged = serve_output.merge({}, {"completed": 5, "mean_ttft_ms": 1.5})
    assert merged == {"completed": 5, "mean_ttft_ms": 1.5}
    # JSON wins over the 2-decimal printed numbers
    merged = serve_output.merge({"mean_ttft_ms": 1.23456}, {"mean_ttft_ms": 1.23})
    assert merged["mean_ttft_ms"] == 1.23456
    assert serve_output.value({"p50_ttft_ms": 7.0}, "ttft", "median") == 7.0
    assert serve_output.value({}, "ttft") is None


def test_failed_run_block() -> None:
    """A real run where every request got 502 from the proxy (engine died)."""
    printed = serve_output.parse_stdout((FIX / "failed.stdout.txt").read_text())
    assert printed["completed"] == 0
    assert printed["failed"] == 20
