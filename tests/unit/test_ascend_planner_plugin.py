"""kvpd's vLLM general plugin that swaps vLLM-Ascend's JIT-built sparse-offload planner for kvpd's.

vLLM-Ascend cannot run here (no NPU), so its manager module is a stand-in (STAND-IN below) with
the real one's shape: `SparseKVOffloadManager.__init__` calls `_build_cpp`, which in the real
manager JIT-compiles the planner and here only records that it ran. vLLM's plugin loader is the
real one, in the CPU engine venv; kvpd is found the way a node finds its bundle: a folder on
PYTHONPATH holding the kvpd package and a dist-info with pyproject's entry points.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from kvpd import ascend_planner_plugin as plugin

REPO = Path(__file__).resolve().parents[2]
ENGINE_PY = Path(os.environ.get("KVPD_ENGINE_VENV", REPO / ".venv-engine")) / "bin" / "python"
if not ENGINE_PY.exists():
    ENGINE_PY = Path("/work/main/.venv-engine/bin/python")

STAND_IN_MANAGER = '''\
"""STAND-IN for vLLM-Ascend's sparse_kv_offload_manager (no NPU here): same class, same hooks."""


class SparseKVOffloadManager:
    def __init__(self):
        self._build_cpp()

    def _build_cpp(self):
        self.sparse_kv_offload_cpp = "STAND-IN: vLLM-Ascend JIT build"

    def _onload_topk_kv_cpu(self, args):
        raise NotImplementedError("STAND-IN")
'''

# Each scenario runs in a child forked after `import vllm.plugins` (one slow import for all).
RUNNER = r"""
import json, logging, os, sys
import vllm.plugins

def scenario(case):
    os.environ.pop("KVPD_SPARSE_PLANNER", None)
    os.environ.pop("VLLM_PLUGINS", None)
    os.environ.update(case["env"])
    records = []
    handler = logging.Handler()
    handler.emit = lambda r: records.append(f"{r.levelname} {r.getMessage()}")
    logging.getLogger("vllm.kvpd_sparse_planner").addHandler(handler)
    logging.getLogger("vllm.kvpd_sparse_planner").setLevel(logging.INFO)
    import kvpd.ascend_planner_plugin as p
    if case.get("trust_stand_in"):
        p.KNOWN_MANAGER_BLOBS[p.git_blob_id(open(sys.argv[2], "rb").read())] = "STAND-IN"
    if case.get("core_missing"):
        sys.modules["kvpd.native._ascend_planner"] = None  # fault injection: core not built
    if case.get("register_raises"):
        def boom():
            raise RuntimeError("fault injection")
        p._register = boom
    vllm.plugins.load_general_plugins()
    from vllm_ascend.distributed.kv_transfer.sparse_kv_offload import sparse_kv_offload_manager as m
    cpp = m.SparseKVOffloadManager().sparse_kv_offload_cpp
    import kvpd
    return {"planner": getattr(cpp, "__name__", cpp), "log": records, "kvpd": kvpd.__file__}

for case in json.loads(sys.argv[1]):
    out = os.path.join(sys.argv[3], case["name"] + ".json")
    pid = os.fork()
    if pid == 0:
        try:
            result = scenario(case)
        except BaseException as e:
            result = {"crash": repr(e)}
        with open(out, "w") as f:
            json.dump(result, f)
        os._exit(0)
    os.waitpid(pid, 0)
"""

SCENARIOS = {
    "on": {"env": {"KVPD_SPARSE_PLANNER": "kvpd"}, "trust_stand_in": True},
    "off": {"env": {}, "trust_stand_in": True},
    "upstream": {"env": {"KVPD_SPARSE_PLANNER": "upstream"}, "trust_stand_in": True},
    "unknown_version": {"env": {"KVPD_SPARSE_PLANNER": "kvpd"}},
    "core_missing": {
        "env": {"KVPD_SPARSE_PLANNER": "kvpd"}, "trust_stand_in": True, "core_missing": True,
    },
    "register_raises": {
        "env": {"KVPD_SPARSE_PLANNER": "kvpd"}, "trust_stand_in": True, "register_raises": True,
    },
    "allowed": {
        "env": {"KVPD_SPARSE_PLANNER": "kvpd", "VLLM_PLUGINS": "other,kvpd_sparse_planner"},
        "trust_stand_in": True,
    },
    "filtered_out": {
        "env": {"KVPD_SPARSE_PLANNER": "kvpd", "VLLM_PLUGINS": "other"}, "trust_stand_in": True,
    },
}  # fmt: skip
KVPD = "kvpd.native.ascend_planner"
UPSTREAM = "STAND-IN: vLLM-Ascend JIT build"


def bundle_folder(root: Path) -> Path:
    """A folder like `pip install --target` makes: kvpd + its dist-info, plus the stand-in."""
    folder = root / "bundle"
    folder.mkdir()
    (folder / "kvpd").symlink_to(REPO / "kvpd")
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    dist = folder / f"kvpd-{meta['version']}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: kvpd\nVersion: {meta['version']}\n"
    )
    eps = "".join(
        f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in entries.items())
        for group, entries in meta["entry-points"].items()
    )
    (dist / "entry_points.txt").write_text(eps)
    pkg = folder / "vllm_ascend/distributed/kv_transfer/sparse_kv_offload"
    pkg.mkdir(parents=True)
    for d in (pkg, *pkg.parents):
        if d == folder:
            break
        (d / "__init__.py").write_text('"""STAND-IN package."""\n')
    (pkg / "sparse_kv_offload_manager.py").write_text(STAND_IN_MANAGER)
    return folder


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict:
    if not ENGINE_PY.exists():
        pytest.skip(f"the CPU engine venv ({ENGINE_PY}) is absent: vLLM's plugin loader is needed")
    root = tmp_path_factory.mktemp("plugin")
    folder = bundle_folder(root)
    manager = folder / "vllm_ascend/distributed/kv_transfer/sparse_kv_offload"
    cases = [{"name": n, **c} for n, c in SCENARIOS.items()]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VLLM_PLUGINS")}
    env.update(PYTHONPATH=str(folder), VLLM_LOGGING_LEVEL="WARNING")
    subprocess.run(
        [str(ENGINE_PY), "-c", RUNNER, json.dumps(cases),
         str(manager / "sparse_kv_offload_manager.py"), str(root)],
        env=env, cwd=root, check=True, timeout=300, capture_output=True,
    )  # fmt: skip
    return {n: json.loads((root / f"{n}.json").read_text()) for n in SCENARIOS}


def test_on_by_environment_through_the_bundle_folder(results) -> None:
    r = results["on"]
    assert r["planner"] == KVPD
    assert r["kvpd"].endswith("/bundle/kvpd/__init__.py")
    assert len(r["log"]) == 1 and r["log"][0].startswith(
        "INFO Sparse KV offload planner: kvpd's native core (kvpd.native.ascend_planner, "
    )


@pytest.mark.parametrize("name", ["off", "upstream"])
def test_off_unless_requested(results, name) -> None:
    assert results[name] == {**results[name], "planner": UPSTREAM, "log": []}


def test_unknown_manager_version_keeps_upstream(results) -> None:
    r = results["unknown_version"]
    assert r["planner"] == UPSTREAM and len(r["log"]) == 1
    assert "WARNING Sparse KV offload planner: vLLM-Ascend's own (JIT build); kvpd: unknown " \
        "vLLM-Ascend manager version" in r["log"][0]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("core_missing", "native planner core (kvpd.native._ascend_planner) is not available"),
        ("register_raises", "(kvpd plugin failed: RuntimeError('fault injection'))"),
    ],
)  # fmt: skip
def test_failures_never_take_the_process_down(results, name, why) -> None:
    r = results[name]
    assert "crash" not in r and r["planner"] == UPSTREAM
    assert len(r["log"]) == 1 and r["log"][0].startswith("WARNING") and why in r["log"][0]


def test_vllm_plugins_allow_list(results) -> None:
    assert results["allowed"]["planner"] == KVPD
    assert results["filtered_out"]["planner"] == UPSTREAM and results["filtered_out"]["log"] == []


def test_import_needs_only_the_standard_library() -> None:
    code = (
        "import sys; before = set(sys.modules); import kvpd.ascend_planner_plugin; "
        "new = {m.split('.')[0] for m in set(sys.modules) - before}; "
        "print(sorted(new - set(sys.stdlib_module_names) - {'kvpd'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_patch_in_process_and_gate(tmp_path, monkeypatch) -> None:
    """The gate and the patch without vLLM: a stand-in module already imported."""
    import types

    src = tmp_path / "sparse_kv_offload_manager.py"
    src.write_text(STAND_IN_MANAGER)
    mod = types.ModuleType("stand_in_manager")
    exec(compile(STAND_IN_MANAGER, str(src), "exec"), mod.__dict__)
    assert "unknown vLLM-Ascend manager version" in plugin.version_gate(str(src))
    assert plugin.patch_manager(mod, str(src)) is False
    assert mod.SparseKVOffloadManager().sparse_kv_offload_cpp == UPSTREAM
    monkeypatch.setitem(plugin.KNOWN_MANAGER_BLOBS, plugin.git_blob_id(src.read_bytes()), "x")
    assert plugin.version_gate(str(src)) is None
    pytest.importorskip("kvpd.native.ascend_planner", reason="native core not built")
    assert plugin.patch_manager(mod, str(src)) is True
    assert mod.SparseKVOffloadManager().sparse_kv_offload_cpp.__name__ == KVPD


def test_known_blob_ids_are_git_blob_ids() -> None:
    assert plugin.git_blob_id(b"") == "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"
