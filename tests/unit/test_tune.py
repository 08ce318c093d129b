"""Hot-buffer sizing (`kvpd tune sparse`) and the top-k traces it simulates."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from kvpd.cli.main import build_app
from kvpd.native.trace import (
    TraceError,
    load_topk_trace,
    save_topk_trace,
    synthetic_topk_trace,
)
from kvpd.native.tune import SparseModelFacts, candidate_buffer_sizes, tune_sparse_buffer

FACTS = SparseModelFacts(index_topk=64, block_size=16, num_layers=61)


def small_trace(**kw):
    args = dict(steps=10, rows=3, topk=64, max_model_len=4096, seq_len_range=(500, 3000), seed=3)
    return synthetic_topk_trace(**{**args, **kw})


def test_synthetic_trace_has_the_requested_overlap() -> None:
    t = small_trace(overlap=0.75, revisit=0.0, steps=30)
    shared = [
        np.intersect1d(t.topk_indices[s, r], t.topk_indices[s + 1, r]).size / 64
        for s in range(29)
        for r in range(3)
    ]
    assert 0.65 < float(np.mean(shared)) < 0.85
    for s in range(30):
        for r in range(3):
            row = t.topk_indices[s, r]
            assert np.unique(row).size == 64  # an indexer's top-k has no repeats
            assert row.max() == t.stable_prefix_lens[s, r]  # the newest token is always chosen


def test_candidates_are_block_multiples_from_topk() -> None:
    sizes = candidate_buffer_sizes(2048, 128)
    assert sizes[0] == 2048
    assert sizes[-1] == 8192
    assert all(s % 128 == 0 for s in sizes)
    assert candidate_buffer_sizes(100, 64)[0] == 128


def test_full_overlap_misses_only_the_newest_token() -> None:
    rep = tune_sparse_buffer(
        small_trace(overlap=1.0),
        FACTS,
        bandwidth_gbps=10,
        tpot_ms=50,
        rows=64,
        buffer_sizes=[64, 128],
    )
    for r in rep.results:
        assert r.misses_per_row == 1.0  # the newest token is past the stable prefix
        assert r.bytes_per_step == 64 * 61 * (512 * 2 + 64 * 2)
        assert r.copy_ms == pytest.approx(r.bytes_per_step / 10e9 * 1e3)
        assert r.device_bytes == 64 * r.buffer_size * 1152 * 61
    assert rep.recommended == 64


def test_bigger_buffer_catches_revisits_and_recommendation_is_smallest_fit() -> None:
    trace = small_trace(overlap=0.7, revisit=0.8, steps=16)
    rep = tune_sparse_buffer(trace, FACTS, bandwidth_gbps=1000, tpot_ms=1, rows=8)
    rates = [r.hit_rate for r in rep.results]
    assert rates[-1] > rates[0] + 0.1
    budget = rep.results[2].copy_ms / 0.25 + 1e-9  # the third size just fits
    rep2 = tune_sparse_buffer(trace, FACTS, bandwidth_gbps=1000, tpot_ms=budget, rows=8)
    assert rep2.recommended == min(r.buffer_size for r in rep2.results if r.fits)
    assert rep2.recommended <= rep.results[2].buffer_size


def test_nothing_fits_gives_none() -> None:
    rep = tune_sparse_buffer(small_trace(), FACTS, bandwidth_gbps=0.001, tpot_ms=1)
    assert rep.recommended is None
    assert not any(r.fits for r in rep.results)


def test_trace_round_trip_and_errors(tmp_path) -> None:
    t = small_trace(steps=3)
    path = tmp_path / "trace.npz"
    save_topk_trace(path, t)
    back = load_topk_trace(path)
    assert np.array_equal(back.topk_indices, t.topk_indices)
    assert back.max_model_len == t.max_model_len
    bad = tmp_path / "bad.npz"
    np.savez(bad, other=np.zeros(3))
    with pytest.raises(TraceError, match="topk_indices"):
        load_topk_trace(bad)
    np.savez(bad, topk_indices=np.zeros((3, 4)))
    with pytest.raises(TraceError, match=r"\[steps, rows, topk\]"):
        load_topk_trace(bad)


def test_cli_tune_sparse_json_and_trace(tmp_path) -> None:
    runner = CliRunner()
    base = [
        "tune",
        "sparse",
        "--bandwidth-gbps",
        "50",
        "--tpot-ms",
        "80",
        "--index-topk",
        "64",
        "--block-size",
        "16",
        "--max-model-len",
        "4096",
        "--seq-len-min",
        "500",
        "--seq-len-max",
        "3000",
        "--rows",
        "2",
        "--steps",
        "4",
    ]
    res = runner.invoke(build_app(), [*base, "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["recommended"] == 64
    assert data["results"][0]["buffer_size"] == 64
    path = tmp_path / "t.npz"
    save_topk_trace(path, small_trace(steps=3))
    res = runner.invoke(build_app(), [*base, "--trace", str(path)])
    assert res.exit_code == 0, res.output
    assert "recommended topk_buffer_size: 64" in res.output
    res = runner.invoke(build_app(), [*base, "--buffer-sizes", "32,64"])
    assert res.exit_code == 2
    assert "index_topk" in res.output


def test_cli_native_info() -> None:
    res = CliRunner().invoke(build_app(), ["native", "info", "--json"])
    assert res.exit_code == 0, res.output
    facts = json.loads(res.output)
    assert facts["implementation"] in ("native", "numpy")
    if facts["implementation"] == "native":
        assert facts["compiler"]
        assert facts["openmp"]
        assert facts["max_threads"] >= 1
