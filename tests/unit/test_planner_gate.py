"""Preflight runs the sparse-planner plugin's own version recognition against the vLLM-Ascend
manager installed on each decode host (a fake package on this machine, through the local
transport), says which planner the host will run, and requires clang + omp.h exactly where
vLLM-Ascend's JIT planner will run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kvpd import ascend_planner_plugin as plugin
from kvpd.exec.local import LocalTransport
from kvpd.exec.preflight.planner_gate import planner_checks
from kvpd.exec.preflight.run import run_checks
from kvpd.plan.value import HostRequirements, HostSpec, Plan, ProcessSpec

MANAGER = "class SparseKVOffloadManager:\n    def _build_cpp(self): ...\n"


def _host_python(tmp_path: Path, with_clang: bool) -> Path:
    """A decode host's venv: `vllm` next to a `python` that sees a fake vllm_ascend, with a
    PATH that has a stand-in clang (resource dir with include/omp.h) or none."""
    site = tmp_path / "site" / "vllm_ascend"
    mgr = site / "distributed/kv_transfer/sparse_kv_offload/sparse_kv_offload_manager.py"
    mgr.parent.mkdir(parents=True)
    (site / "__init__.py").write_text("raise ImportError('preflight must not import me')\n")
    mgr.write_text(MANAGER)
    tools = tmp_path / "tools"
    tools.mkdir()
    if with_clang:
        (tmp_path / "res/include").mkdir(parents=True)
        (tmp_path / "res/include/omp.h").write_text("")
        clang = tools / "clang"
        clang.write_text(f"#!/bin/sh\necho {tmp_path / 'res'}\n")
        clang.chmod(0o755)
    venv = tmp_path / "venv/bin"
    venv.mkdir(parents=True)
    py = venv / "python"
    py.write_text(
        f'#!/bin/sh\nPATH={tools} PYTHONPATH={tmp_path / "site"} exec {sys.executable} "$@"\n'
    )
    py.chmod(0o755)
    return venv / "vllm"


def _plan(vllm: Path, planner: str) -> Plan:
    decode = ProcessSpec(
        name="decode-0", host="here", role="decode", stage=1, script="s.sh",
        command=(str(vllm), "serve", "/m"), env=(("KVPD_SPARSE_PLANNER", planner),),
    )  # fmt: skip
    return Plan(
        deployment="pg", profile_digest="d",
        hosts=(HostSpec("here", "127.0.0.1", transport="local"),),
        files=(), processes=(decode,), requirements={"here": HostRequirements()},
    )  # fmt: skip


def _checks(plan: Plan) -> dict[str, str]:
    got = planner_checks(plan, lambda h: LocalTransport(), {"here"})
    return {c.name: ("ok " if c.ok else "FAIL ") + c.detail + c.fix for c in got}


def test_unknown_manager_means_upstream_planner_and_needs_the_compiler(tmp_path: Path) -> None:
    got = _checks(_plan(_host_python(tmp_path, with_clang=False), "kvpd"))
    assert "vLLM-Ascend's own, JIT-built" in got["sparse planner"]
    assert "unknown vLLM-Ascend manager version" in got["sparse planner"]
    assert got["clang + omp.h"].startswith("FAIL ")
    assert "apt-get install" in got["clang + omp.h"]


def test_unknown_manager_with_a_compiler_passes(tmp_path: Path) -> None:
    got = _checks(_plan(_host_python(tmp_path, with_clang=True), "kvpd"))
    assert got["clang + omp.h"].startswith("ok ")


def test_known_manager_runs_kvpd_planner_without_a_compiler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blob = plugin.git_blob_id(MANAGER.encode())
    monkeypatch.setattr(plugin, "KNOWN_MANAGER_BLOBS", {blob: "test version"})
    plan = _plan(_host_python(tmp_path, with_clang=False), "kvpd")
    got = _checks(plan)
    assert got["sparse planner"].startswith("ok kvpd's native core")
    assert "clang + omp.h" not in got
    names = {c.name for c in run_checks(plan, lambda h: LocalTransport())}
    assert "sparse planner" in names  # part of every preflight


def test_upstream_planner_is_named(tmp_path: Path) -> None:
    got = _checks(_plan(_host_python(tmp_path, with_clang=False), "upstream"))
    assert "KVPD_SPARSE_PLANNER=upstream" in got["sparse planner"]


def test_missing_vllm_ascend_is_a_doubt(tmp_path: Path) -> None:
    vllm = _host_python(tmp_path, with_clang=False)
    (tmp_path / "site/vllm_ascend/__init__.py").unlink()
    (tmp_path / "site/vllm_ascend").rename(tmp_path / "site/other")
    got = _checks(_plan(vllm, "kvpd"))
    assert "not importable" in got["sparse planner"]
    assert got["clang + omp.h"].startswith("FAIL ")


def test_a_rehearsals_stand_in_decode_is_not_judged(tmp_path: Path) -> None:
    import dataclasses

    plan = _plan(_host_python(tmp_path, with_clang=False), "kvpd")
    proc = dataclasses.replace(plan.processes[0], substituted="CPU vllm serve of a tiny model")
    assert _checks(dataclasses.replace(plan, processes=(proc,))) == {}
