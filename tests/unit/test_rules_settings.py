"""Settings that would be dropped or read two ways are refused or named plainly."""

from __future__ import annotations

from pathlib import Path

from tests.unit.newcomer import error, plan
from tests.unit.test_rules import LW
from tests.unit.test_rules import error as bundled_error
from tests.unit.test_rules import warnings as bundled_warnings

SPREAD = "mixed.placement=spread"


def test_kv_port_without_a_connector_that_binds_one_is_refused(tmp_path: Path) -> None:
    e = error(tmp_path, SPREAD, "mixed.kv_connectors=[ucm]", "mixed.kv_port=30001",
              "kv.ucm={storage: /mnt/ucm}")  # fmt: skip
    assert "mixed.kv_port: kv_port 30001 is set, but mixed's connectors (ucm) bind no KV port" in e


def test_kv_port_on_prefill_sfa_d2h_is_refused_but_decode_uses_it() -> None:
    e = bundled_error(LW, "prefill.kv_port=30050")
    assert "prefill.kv_port: kv_port 30050 is set, but prefill's connectors" in e
    assert "decode.kv_port" not in e


def test_dsa_is_named_sfa() -> None:
    w = bundled_warnings(LW, "model.attention=dsa")
    assert "model.attention: dsa (DeepSeek Sparse Attention, the model-side name)" in w
    assert "Write attention: sfa." in w


def test_mla_with_an_indexer_is_sfa() -> None:
    assert "a model with a sparse indexer (DeepSeek-V3.2" in bundled_warnings(
        LW, "model.attention=mla"
    )


def test_bundled_profiles_name_glm5_the_same_way() -> None:
    for name in ("large-ep", "layerwise-sparse-1p1d"):
        assert "model.attention" not in bundled_warnings(name)


def test_newcomer_profile_plans_when_spread(tmp_path: Path) -> None:
    assert plan(tmp_path, SPREAD, "mixed.tp=16").warnings == ()
