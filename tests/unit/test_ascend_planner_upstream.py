"""kvpd's planner against vLLM-Ascend's own planner, built here from the user's copy of its source.

The source is never part of kvpd: set KVPD_UPSTREAM_PLANNER_CPP to vLLM-Ascend's
`sparse_kv_offload.cpp` (the message of the skip says how to fetch it). It is compiled with
-O3 -march=native, as vLLM-Ascend's manager JIT-builds it, and both modules plan the same decode
traces (tests/unit/upstream_equivalence.py): every output and every state after every step must
be equal, on every kvpd row planner this CPU offers and on 1 and 2 threads. The same comparison
runs under qemu for aarch64 in test_native_aarch64.py.
"""

from __future__ import annotations

import os
import shutil
import sysconfig
from pathlib import Path

import pytest

from tests.unit import upstream_equivalence as ue

pytest.importorskip("kvpd.native._ascend_planner", reason="kvpd's native core is not built")


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> object:
    cpp, why = ue.upstream_source(dict(os.environ))
    if cpp is None:
        pytest.skip(why)
    compiler = os.environ.get("CXX", "g++")
    if shutil.which(compiler) is None:
        pytest.skip(f"no C++ compiler ({compiler}) to build vLLM-Ascend's planner")
    out = tmp_path_factory.mktemp("upstream")
    include = Path(sysconfig.get_paths()["include"])
    suffix = str(sysconfig.get_config_var("EXT_SUFFIX"))
    ue.compile_upstream(cpp, out, compiler, [include], ["-march=native"], suffix)
    return ue.load_upstream(out)


def test_kvpd_plans_as_vllm_ascends_own_planner(upstream: object) -> None:
    result = ue.compare(upstream)
    assert result["mismatches"] == [], result
    assert result["runs"] == len(ue.CASES) * 2 * len(result["isas"])


def test_without_the_source_the_skip_says_how_to_get_it(tmp_path: Path) -> None:
    path, why = ue.upstream_source({})
    assert path is None
    assert why == ue.NO_SOURCE
    assert ue.UPSTREAM_ENV in why
    assert "github.com/vllm-project/vllm-ascend" in why
    assert ue.UPSTREAM_PATH in why
    assert "182b75ea" in why
    missing = tmp_path / "nowhere.cpp"
    path, why = ue.upstream_source({ue.UPSTREAM_ENV: str(missing)})
    assert path is None
    assert str(missing) in why
    assert "is not a file" in why
    real = tmp_path / "sparse_kv_offload.cpp"
    real.write_text("// planner\n")
    assert ue.upstream_source({ue.UPSTREAM_ENV: str(real)}) == (real, "")
