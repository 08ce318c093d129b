"""`kvpd bench` on the real local CPU deployment: the guide's prefix protocol yields prefix-cache
hits in the measured phase, decode receives KV, and the results folder is complete.

On the shared local deployment (local_deploy.py), whose `up` is the one this bench needs: each
`kvpd bench` draws prompts no earlier run sent (kvpd.bench.freshness), whatever ran on the
deployment before."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.local_deploy import LocalDeployment, kvpd

pytestmark = pytest.mark.e2e


def test_prefix_protocol_hits_the_seeded_prefixes(
    local_deployment: LocalDeployment, tmp_path: Path
) -> None:
    out = tmp_path / "bench"
    r = kvpd("bench", "local", *local_deployment.args, "--protocol", "prefix", "--num-prompts", "8",
             "--input-len", "128", "--output-len", "8", "--results", str(out), "--json",
             check=False)  # fmt: skip
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}"
    run = json.loads(r.stdout)
    assert run["ok"]
    assert run["protocol"] == "prefix"
    seed, measured = run["records"]
    assert (seed["phase"], seed["input_len"], seed["output_len"]) == ("seed", 102, 1)
    assert (measured["phase"], measured["input_len"]) == ("measured", 128)
    assert measured["result"]["completed"] == 8
    assert measured["result"]["failed"] == 0
    for key in ("mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "mean_e2el_ms"):
        assert measured["result"][key] > 0
    # the measured prompts start with the seeded ones: prefill finds them in its prefix cache
    pre = measured["metrics"]["per_target"]["prefill-0"]
    assert pre["prefix_cache_hits"] > 0
    assert pre["local_cache_hit_tokens"] / pre["prompt_tokens"] >= 0.5  # 96 of 128 per prompt
    # the seeding phase is where KV moved from prefill to decode
    assert seed["metrics"]["summary"]["decode_kv_received_tokens"] > 0
    assert measured["metrics"]["summary"]["decode_requests"] >= 8
    for name in ("results.json", "results.csv", "latency.png", "ttft_cdf.png"):
        assert (out / name).is_file(), name
    assert json.loads((out / "results.json").read_text())["format"] == "kvpd-bench/1"
    # the store connector's per-request `hit ... hit external` lines were read from the log
    assert any("store log lines of 1 engine(s)" in n for n in run["notes"]), run["notes"]
    # the saved run reads back: compared with itself nothing changed, so a 0 % gate passes.
    r = kvpd("bench", "--compare", str(out), str(out), "--max-regression", "0%")
    assert "TTFT mean" in r.stdout
    assert "+0.0%" in r.stdout
