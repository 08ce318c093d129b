"""Capacity before load: heads over TP, weights plus KV per device, pools, bench prompts."""

from __future__ import annotations

import json
from pathlib import Path

from tests.unit.newcomer import error
from tests.unit.test_rules import LW
from tests.unit.test_rules import error as bundled_error
from tests.unit.test_rules import plan as bundled_plan
from tests.unit.test_rules import warnings as bundled_warnings

SPREAD = "mixed.placement=spread"


def test_tp_must_divide_the_attention_heads_of_a_latent_model() -> None:
    e = bundled_error(LW, "model.heads=128", "prefill.tp=6", "decode.tp=6")
    assert "prefill.tp: tp 6 does not divide the model's 128 attention heads" in e


def test_weights_that_do_not_fit_a_device_are_refused(tmp_path: Path) -> None:
    # 64 GB a die x 0.9 = 57.6 GB; 640 GB of weights over tp 8 = 80 GB a die
    e = error(tmp_path, SPREAD, "model.weights_gb=640")
    assert "mixed.tp: the weights (640 GB / 8 devices = 80.0 GB a device) do not fit" in e
    assert "64 GB x gpu_memory_utilization 0.9 = 57.6 GB" in e


def test_weights_plus_one_sequence_must_fit(tmp_path: Path) -> None:
    # 57.6 - 57 GB leaves 0.6 GB; a token is 64 x 2 x 1 x 128 x 2 B = 32 KiB a die: 19660 < 32768
    e = error(tmp_path, SPREAD, "model.weights_gb=456", "model.max_model_len=32768")
    assert "57.6 GB usable - 57.0 GB of weights), 19660 tokens" in e
    assert "less than one max_model_len 32768 sequence" in e


def test_kv_cache_memory_bytes_counts_as_the_kv_size(tmp_path: Path) -> None:
    e = error(tmp_path, SPREAD, "model.weights_gb=400", "mixed.kv_cache_memory_bytes=16G")
    assert "mixed.kv_cache_memory_bytes: the weights (400 GB / 8 devices = 50.0 GB a device)" in e
    e = error(tmp_path, SPREAD, "mixed.kv_cache_memory_bytes=256M", "model.max_model_len=32768")
    assert "a device keeps 0.2 GB for KV (kv_cache_memory_bytes), 8192 tokens" in e


def test_weights_read_from_the_model_dir(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"num_hidden_layers": 64}))
    index = {"metadata": {"total_size": 640 * 2**30}, "weight_map": {}}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    e = error(tmp_path, SPREAD, f"model.config={model}")
    assert "the weights (640 GB / 8 devices" in e


def test_sparse_pool_must_hold_one_sequence() -> None:
    # 32768 tokens x 89,856 B = 2.7 GiB > 2 GB
    e = bundled_error(LW, "engine.max_num_seqs=null", "decode.sparse_offload.dram_size_per_dp_gb=2")
    assert "dram_size_per_dp_gb: 2 GB cannot hold one max_model_len sequence" in e


def test_plan_says_how_many_bench_prompts_fit_prefill_hbm() -> None:
    w = bundled_warnings(LW, "model.weights_gb=700", "bench.num_prompts=1000")
    assert "bench.num_prompts: " in w
    assert "of the bench's 1000 prompts of 16384 tokens fit" in w
    p = bundled_plan(LW, "model.weights_gb=700")
    assert any(
        d.startswith("bench: 16 prompts of 16384 tokens; the prefill HBM KV cache holds only 10")
        for d in p.derived
    )


def test_memcache_auto_is_sized_from_what_the_engines_hold() -> None:
    # 78 x (512 + 64) x 2 B = 89,856 B a token x 32768 x (1 instance x dp 1 x 16 seqs) / 16
    base = ("kv.memcache.dram_size=auto",)
    conf = "conf/mmc-local.conf"

    def dram(*more: str) -> str:
        p = bundled_plan(LW, *base, *more)
        return next(f.content for f in p.files if f.host == "p1" and f.path == conf)

    assert "dram.size = 3GB" in dram()
    assert "dram.size = 3GB" in dram("bench.num_prompts=128")  # the bench does not size it
    assert "dram.size = 6GB" in dram("engine.max_num_seqs=32")
    assert "dram.size = 1GB" in dram("kv.memcache.sizing_concurrency=4")
