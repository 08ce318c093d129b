"""The output check on the real local CPU deployment: with kvpd's store connector corrupting
the blocks decode loads (its fault injection switch, checksums still valid) the /metrics proof
passes and the output check fails, in `kvpd up`'s canary and in `kvpd bench` (a deployment of
its own); without the fault both pass (the shared local deployment)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kvpd.exec.events import EventLog
from tests.e2e.local_deploy import REPO, engine_missing, kvpd, local_sets, set_args

pytestmark = pytest.mark.e2e

NAME, PORT = "e2e-outputs", 18660  # own deployment and ports
FAULT = "decode.env.KVPD_FAULT_CORRUPT_LOADED_BLOCKS=flip"
BENCH = ("--num-prompts", "4", "--input-len", "128", "--output-len", "8", "--json")


@pytest.fixture
def args():
    reason = engine_missing()
    if reason:
        pytest.skip(reason)
    a = set_args(local_sets(NAME, PORT))
    kvpd("down", "--deployment", NAME, check=False)
    shutil.rmtree(REPO / ".kvpd" / NAME, ignore_errors=True)
    try:
        yield a
    finally:
        kvpd("down", "--deployment", NAME, check=False)


def test_corrupted_blocks_pass_metrics_and_fail_outputs(args, tmp_path: Path) -> None:
    r = kvpd("up", "local", "--yes", "--json", "--keep-on-failure", *args, "--set", FAULT,
             check=False)  # fmt: skip
    assert r.returncode != 0, r.stdout
    canary = json.loads(r.stdout)["canary"]
    # KV moved: decode received the prompt's tokens from the store, as counted by vLLM
    assert canary["delta"]["summary"]["decode_kv_received_tokens"] > 0
    assert canary["outputs"]["ok"] is False
    first = canary["outputs"]["prompts"][0]
    assert first["pair"] == "prefill-0 -> decode-0"
    assert first["diverged_at"] is not None
    assert "the /metrics proof passed (P→D KV handover verified" in r.stderr
    assert "prefill-0 -> decode-0 diverges from prefill-0 alone" in r.stderr
    assert "at token" in r.stderr
    # the bench of the same (kept) deployment: the /metrics proof passes, the outputs do not
    out = tmp_path / "bad"
    r = kvpd("bench", "local", *args, "--results", str(out), *BENCH, check=False)
    assert r.returncode != 0
    rec = json.loads(r.stdout)["records"][0]
    assert rec["metrics"]["summary"]["decode_kv_received_tokens"] > 0
    assert not [p for p in rec["problems"] if "outputs differ" not in p], rec["problems"]
    assert rec["outputs"]["summary"].startswith("outputs: FAILED: 0/4 identical")
    r = kvpd("bench", "--compare", str(out), str(out), check=False)
    assert r.returncode != 0
    assert "refusing to compare" in r.stderr


def test_healthy_store_passes_both(local_deployment, tmp_path: Path) -> None:
    """The shared local deployment (its `up` ran the canary with the output check)."""
    dep = local_deployment
    canaries = [e for e in EventLog(REPO / ".kvpd", dep.name).read() if e.what == "canary"]
    assert canaries, canaries
    assert canaries[-1].data["ok"], canaries
    assert canaries[-1].detail.endswith("; outputs: 4/4 identical (first 16 tokens)")
    out = tmp_path / "good"
    r = kvpd("bench", "local", *dep.args, "--results", str(out), *BENCH, check=False)
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}"
    rec = json.loads(r.stdout)["records"][0]
    assert rec["outputs"]["summary"] == "outputs: 4/4 identical (first 16 tokens)"
    assert rec["metrics"]["summary"]["decode_kv_received_tokens"] > 0
    saved = json.loads((out / "results.json").read_text())
    assert saved["records"][0]["outputs"]["ok"] is True
    kvpd("bench", "--compare", str(out), str(out))
