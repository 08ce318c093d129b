"""Model facts from config.json fill what the profile leaves out."""

from __future__ import annotations

import json
from pathlib import Path

from kvpd.plan.build import load_plan
from kvpd.profile.model_facts import facts_from_config

QWQ = {
    "num_hidden_layers": 64,
    "num_attention_heads": 40,
    "num_key_value_heads": 8,
    "hidden_size": 5120,
    "torch_dtype": "bfloat16",
}
GLM5 = {
    "num_hidden_layers": 78,
    "kv_lora_rank": 512,
    "qk_rope_head_dim": 64,
    "index_topk": 2048,
    "num_attention_heads": 64,
    "torch_dtype": "bfloat16",
}


def test_gqa_facts() -> None:
    assert facts_from_config(QWQ) == {
        "layers": 64,
        "kv_heads": 8,
        "heads": 40,
        "attention": "gqa",
        "head_dim": 128,
        "dtype": "bfloat16",
    }


def test_sparse_mla_facts() -> None:
    f = facts_from_config(GLM5)
    assert f["attention"] == "sfa"
    assert f["kv_lora_rank"] == 512
    assert f["index_topk"] == 2048


def test_profile_reads_config_and_keeps_its_own_values(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(GLM5))
    plan = load_plan(
        "layerwise-sparse-1p1d",
        sets=[
            f"model.config={tmp_path}",
            "model.layers=null",
            "model.index_topk=null",
            "decode.sparse_offload.topk_buffer_size=4096",
        ],
    )
    assert plan.deployment == "layerwise-sparse-1p1d"  # facts filled: the sparse rules pass


def test_missing_config_is_a_clear_error(tmp_path: Path) -> None:
    import pytest

    from kvpd.errors import ProfileError

    with pytest.raises(ProfileError, match="does not exist on this machine"):
        load_plan("local", sets=[f"model.config={tmp_path}/nope"])
