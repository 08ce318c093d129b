"""The sparse-offload planner choice: rules (each a failing profile and its message), the decode
environment and the preflight requirements it leads to."""

from __future__ import annotations

import pytest

from kvpd.errors import ProfileError
from kvpd.plan.build import load_plan
from kvpd.plan.value import Plan

LW = "layerwise-sparse-1p1d"  # GLM-5.1: 78 layers, kv_lora_rank 512, rope 64, block 128


def plan(*sets: str) -> Plan:
    return load_plan(LW, sets=list(sets), base_dir="/srv/kvpd")


def error(*sets: str) -> str:
    with pytest.raises(ProfileError) as e:
        plan(*sets)
    return str(e.value)


def decode_env(p: Plan) -> dict[str, str]:
    return dict(p.process("decode-0").env)


@pytest.mark.parametrize(("planner", "want"), [("auto", "kvpd"), ("kvpd", "kvpd")])
def test_kvpd_planner_needs_no_compiler_on_decode(planner, want) -> None:
    p = plan(f"decode.sparse_offload.planner={planner}")
    assert decode_env(p)["KVPD_SPARSE_PLANNER"] == want
    assert p.requirements["d1"].clang_omp is False


def test_upstream_planner_still_needs_clang_and_omp() -> None:
    p = plan("decode.sparse_offload.planner=upstream")
    assert decode_env(p)["KVPD_SPARSE_PLANNER"] == "upstream"
    assert p.requirements["d1"].clang_omp is True


def test_upstream_planner_refuses_a_pool_past_the_32bit_block_limit() -> None:
    msg = error(
        "decode.sparse_offload.planner=upstream", "decode.sparse_offload.dram_size_per_dp_gb=200"
    )
    assert (
        "decode.sparse_offload.dram_size_per_dp_gb: a 200 GiB host pool per DP rank holds 18,671 "
        "blocks (78 layers x block 128 x 1152 B per token), so block ids reach 18,670; "
        "vLLM-Ascend's planner (planner: upstream) computes host addresses as a 32-bit product "
        "block_id x 131,072 B, which wraps from block id 16,384: decode would load K/V from wrong "
        "host memory. Use planner: kvpd (kvpd's planner computes addresses in 64 bits and has no "
        "such limit) or at most 175 GiB."
    ) in msg


def test_pool_limit_boundary_and_kvpd_planner_has_none() -> None:
    plan("decode.sparse_offload.planner=upstream", "decode.sparse_offload.dram_size_per_dp_gb=175")
    plan("decode.sparse_offload.planner=kvpd", "decode.sparse_offload.dram_size_per_dp_gb=1024")
    assert "wraps from block id 8,192" in error(
        "decode.sparse_offload.planner=upstream",
        "decode.sparse_offload.dram_size_per_dp_gb=200",
        "engine.block_size=256",
    )


def test_vllm_plugins_must_allow_the_kvpd_plugin() -> None:
    msg = error("decode.env={VLLM_PLUGINS: ascend}")
    assert (
        "decode.env.VLLM_PLUGINS: VLLM_PLUGINS='ascend' is vLLM's allow-list of plugins and leaves "
        "out 'kvpd_sparse_planner', so decode would run vLLM-Ascend's JIT-built planner although "
        "decode.sparse_offload.planner is kvpd. Set VLLM_PLUGINS=ascend,kvpd_sparse_planner or "
        "planner: upstream."
    ) in msg
    spaced = error("env={VLLM_PLUGINS: 'ascend, kvpd_sparse_planner'}")
    assert "env.VLLM_PLUGINS: " in spaced
    assert "vLLM does not strip spaces" in spaced
    p = plan("engine.env={VLLM_PLUGINS: 'ascend,kvpd_sparse_planner'}")
    assert decode_env(p)["VLLM_PLUGINS"] == "ascend,kvpd_sparse_planner"
    plan("decode.sparse_offload.planner=upstream", "decode.env={VLLM_PLUGINS: ascend}")


def test_planner_variable_is_set_through_the_profile_field() -> None:
    msg = error("decode.env={KVPD_SPARSE_PLANNER: upstream}")
    assert (
        "decode.env.KVPD_SPARSE_PLANNER: kvpd sets KVPD_SPARSE_PLANNER from "
        "decode.sparse_offload.planner; set the planner there (auto | kvpd | upstream) instead of "
        "the variable."
    ) in msg


def test_unknown_planner_value_is_a_schema_error() -> None:
    assert "decode.sparse_offload.planner" in error("decode.sparse_offload.planner=jit")


def test_rehearsal_decode_environment_carries_the_planner() -> None:
    p = load_plan(LW, rehearse=True, base_dir="/srv/kvpd")
    assert decode_env(p)["KVPD_SPARSE_PLANNER"] == "kvpd"
    assert "KVPD_SPARSE_PLANNER" not in dict(p.process("prefill-0").env)


def test_sparse_decode_is_rendered_on_model_runner_v1() -> None:
    """Sparse offload refuses Model Runner V2: the decode launch script selects V1 with the
    variable the installed vLLM reads (vllm/envs.py), not only a rule on a flag."""
    p = plan()
    assert decode_env(p)["VLLM_USE_V2_MODEL_RUNNER"] == "0"
    script = next(f.content for f in p.files if f.path == "decode-0/launch.sh")
    assert "export VLLM_USE_V2_MODEL_RUNNER=0\n" in script
    assert "VLLM_USE_V2_MODEL_RUNNER" not in dict(p.process("prefill-0").env)
