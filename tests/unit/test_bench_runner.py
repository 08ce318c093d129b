"""The `vllm bench serve` command lines of each protocol, and finding the client."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvpd.bench import runner
from kvpd.bench.settings import Scenario, int_list, make_settings, resolve_scenarios
from kvpd.errors import BenchError
from kvpd.plan.bench import bench_spec
from kvpd.profile.schema import Bench


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_prefix_protocol_arithmetic_matches_the_guide() -> None:
    # the guide: 32k target -> 25600 seeded tokens with output 1
    assert runner.seed_input_len(32000, 0.8) == 25600
    assert runner.seed_input_len(64000, 0.8) == 51200
    assert runner.seed_input_len(128, 0.8) == 102  # rounded down
    assert runner.seed_input_len(1, 0.5) == 1
    seed, measured = runner.protocol_phases(
        "prefix", input_len=32000, output_len=1000, num_prompts=128, seed=123456,
        request_rate="inf", max_concurrency=128, ignore_eos=True, prefix_ratio=0.8,
    )  # fmt: skip
    assert (seed.name, seed.input_len, seed.output_len, seed.measured) == ("seed", 25600, 1, False)
    assert (measured.name, measured.input_len, measured.output_len) == ("measured", 32000, 1000)
    assert seed.seed == measured.seed == 123456
    assert seed.num_prompts == measured.num_prompts == 128
    a = runner.build_argv("vllm", seed, base_url="http://h:1/", model="m", tokenizer="/t",
                          result_dir="/r", result_filename="s.json")  # fmt: skip
    b = runner.build_argv("vllm", measured, base_url="http://h:1/", model="m", tokenizer="/t",
                          result_dir="/r", result_filename="m.json")  # fmt: skip
    assert _flag(a, "--random-input-len") == "25600"
    assert _flag(a, "--random-output-len") == "1"
    assert _flag(b, "--random-input-len") == "32000"
    assert _flag(b, "--random-output-len") == "1000"
    # identical draws in both phases: same seed, same count, fixed lengths
    for flag in ("--seed", "--num-prompts", "--random-range-ratio", "--dataset-name"):
        assert _flag(a, flag) == _flag(b, flag)
    assert _flag(a, "--random-range-ratio") == "0"


def test_argv_has_the_guide_flags_and_kvpd_metadata() -> None:
    (ph,) = runner.protocol_phases("plain", input_len=128, output_len=16, num_prompts=20, seed=0,
                                   request_rate=2.5, max_concurrency=4, ignore_eos=True,
                                   prefix_ratio=0.8)  # fmt: skip
    argv = runner.build_argv(
        "/x/vllm", ph, base_url="http://127.0.0.1:18000/", model="tiny", tokenizer="/m/tiny",
        result_dir="/r", result_filename="f.json",
        metadata={"kvpd_profile": "local", "kvpd_scenario": "hbm"},
    )  # fmt: skip
    assert argv[:3] == ["/x/vllm", "bench", "serve"]
    assert _flag(argv, "--base-url") == "http://127.0.0.1:18000"
    assert _flag(argv, "--backend") == "vllm"
    assert _flag(argv, "--model") == "tiny"
    assert _flag(argv, "--tokenizer") == "/m/tiny"
    assert _flag(argv, "--request-rate") == "2.5"
    assert _flag(argv, "--max-concurrency") == "4"
    assert _flag(argv, "--percentile-metrics") == "ttft,tpot,itl,e2el"
    assert _flag(argv, "--metric-percentiles") == "50,90,99"
    assert {"--ignore-eos", "--save-result", "--disable-tqdm"} <= set(argv)
    assert _flag(argv, "--result-dir") == "/r"
    assert _flag(argv, "--result-filename") == "f.json"
    meta = argv[argv.index("--metadata") + 1 :]
    assert meta == ["kvpd_phase=run", "kvpd_profile=local", "kvpd_scenario=hbm"]


def test_unlimited_rate_no_concurrency_no_ignore_eos() -> None:
    (ph,) = runner.protocol_phases("plain", input_len=8, output_len=8, num_prompts=1, seed=1,
                                   request_rate="inf", max_concurrency=None, ignore_eos=False,
                                   prefix_ratio=0.8)  # fmt: skip
    argv = runner.build_argv("v", ph, base_url="u", model="m", tokenizer="", result_dir="d",
                             result_filename="f")  # fmt: skip
    assert _flag(argv, "--request-rate") == "inf"
    assert "--max-concurrency" not in argv
    assert "--ignore-eos" not in argv
    assert "--tokenizer" not in argv


def test_twice_is_cold_then_warm_with_the_same_prompts() -> None:
    cold, warm = runner.protocol_phases("twice", input_len=8000, output_len=1000,
                                        num_prompts=10, seed=123456, request_rate="inf",
                                        max_concurrency=None, ignore_eos=True,
                                        prefix_ratio=0.8)  # fmt: skip
    assert (cold.name, warm.name) == ("cold", "warm")
    assert cold.measured
    assert warm.measured
    assert (cold.input_len, cold.seed) == (warm.input_len, warm.seed)
    with pytest.raises(BenchError, match="unknown bench protocol"):
        runner.protocol_phases("thrice", input_len=1, output_len=1, num_prompts=1, seed=0,
                               request_rate="inf", max_concurrency=None, ignore_eos=True,
                               prefix_ratio=0.8)  # fmt: skip


def test_missing_client_says_make_engine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("KVPD_VLLM", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("KVPD_ENGINE_VENV", str(tmp_path / "no-venv"))
    with pytest.raises(runner.ClientNotInstalled, match="make engine"):
        runner.find_vllm()
    monkeypatch.setenv("KVPD_VLLM", str(tmp_path / "nope"))
    with pytest.raises(runner.ClientNotInstalled, match="KVPD_VLLM"):
        runner.find_vllm()
    exe = tmp_path / "vllm"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    monkeypatch.setenv("KVPD_VLLM", str(exe))
    assert runner.find_vllm() == str(exe)
    monkeypatch.delenv("KVPD_VLLM")
    assert runner.find_vllm() == str(exe)  # on PATH


def test_client_env_is_offline_for_a_local_tokenizer(tmp_path: Path) -> None:
    env = runner.client_env(str(tmp_path), "http://10.0.0.5:8000")
    assert env["HF_HUB_OFFLINE"] == os.environ.get("HF_HUB_OFFLINE", "1")
    assert "10.0.0.5" in env["NO_PROXY"].split(",")


def test_settings_sweep_and_overrides() -> None:
    bench = bench_spec(Bench(seed=1))  # the schema's defaults: 1024 in, 128 out, no limit
    s = make_settings(bench)
    assert [(p.input_len, p.output_len, p.max_concurrency) for p in s.points] == [(1024, 128, None)]
    s = make_settings(bench, protocol="prefix", input_lens=[128, 256], concurrencies=[1, 4],
                      request_rate="2")  # fmt: skip
    assert s.protocol == "prefix"
    assert [(p.input_len, p.max_concurrency) for p in s.points] == [
        (128, 1), (128, 4), (256, 1), (256, 4)
    ]  # fmt: skip
    assert s.points[0].request_rate == 2.0
    s = make_settings(bench_spec(Bench(sweep={"input_len": [32, 64]})))
    assert [p.input_len for p in s.points] == [32, 64]
    assert int_list("1, 2,3", "x") == [1, 2, 3]
    with pytest.raises(BenchError):
        int_list("1,a", "--input-len")
    with pytest.raises(BenchError):
        make_settings(bench, prefix_ratio=1.0)
    with pytest.raises(BenchError):
        make_settings(bench, protocol="nope")


def test_scenarios_from_profile_presets_and_inline() -> None:
    bench = bench_spec(
        Bench(scenarios={"external": ["kv.ucm.enabled=true", "prefill.kv_connectors=[ucm]"]})
    )
    got = resolve_scenarios(
        ["recompute", "hbm", "external", "tuned:engine.max_num_seqs=8;engine.block_size=64"], bench
    )
    assert got == [
        Scenario("recompute", ("engine.enable_prefix_caching=false",), "none"),
        Scenario("hbm", ("engine.enable_prefix_caching=true",), "hbm"),
        # a profile's list form replaces the preset and checks no cache: no behaviour is
        # keyed on a scenario's name
        Scenario("external", ("kv.ucm.enabled=true", "prefill.kv_connectors=[ucm]")),
        Scenario("tuned", ("engine.max_num_seqs=8", "engine.block_size=64")),
    ]
    with pytest.raises(BenchError, match="unknown scenario 'x'"):
        resolve_scenarios(["x"], bench)
    with pytest.raises(BenchError, match="twice"):
        resolve_scenarios(["hbm", "hbm"], bench)
    with pytest.raises(BenchError, match="field.path=value"):
        resolve_scenarios(["bad:novalue"], bench)


def test_presets_detach_external_stores_and_keep_the_p2p_path() -> None:
    """The guide's recompute and HBM rows have no UCM: the presets take every store connector
    away (Mooncake, the P->D path, stays); `external` is the deployment as it is."""
    conns = {"prefill": ["mooncake", "ucm"], "decode": ["mooncake"]}
    rec, hbm, ext = resolve_scenarios(["recompute", "hbm", "external"], bench_spec(Bench()), conns)
    assert rec.sets == ("engine.enable_prefix_caching=false", "prefill.kv_connectors=[mooncake]")
    assert (rec.cache, rec.without) == ("none", ("ucm",))
    assert hbm.sets[-1] == "prefill.kv_connectors=[mooncake]"
    assert hbm.cache == "hbm"
    assert (ext.sets, ext.cache) == ((), "external")
    mixed = resolve_scenarios(["recompute"], bench_spec(Bench()), {"mixed": ["ucm"]})
    assert mixed[0].sets[-1] == "mixed.kv_connectors=[]"
    # a store that is the only P->D path cannot be taken away
    with pytest.raises(BenchError, match="only KV connector of prefill, the P->D path"):
        resolve_scenarios(["hbm"], bench_spec(Bench()), {"prefill": ["ucm"], "decode": ["ucm"]})


def test_profile_scenario_mapping_names_its_cache() -> None:
    from kvpd.profile.schema import BenchScenario

    b = Bench(
        scenarios={
            "ucm-off": BenchScenario(without=["ucm"], cache="hbm"),
            "mine": BenchScenario(sets=["engine.max_num_seqs=8"], cache="external"),
        }
    )
    conns = {"prefill": ["mooncake", "ucm"], "decode": ["mooncake"]}
    off, mine = resolve_scenarios(["ucm-off", "mine"], bench_spec(b), conns)
    assert off.sets == ("prefill.kv_connectors=[mooncake]",)
    assert off.cache == "hbm"
    assert mine.expect_external
    assert mine.without == ()


def test_prompts_longer_than_max_model_len_are_refused_with_both_fixes() -> None:
    from kvpd.bench.settings import check_lengths

    s = make_settings(bench_spec(Bench(input_len=32000, output_len=1000)))
    with pytest.raises(BenchError) as e:
        check_lengths(s, 17000)
    assert "exceed max_model_len 17000" in str(e.value)
    assert "--input-len 16000" in str(e.value)
    assert "model.max_model_len=33000" in str(e.value)
    check_lengths(s, 33000)
    check_lengths(s, None)
