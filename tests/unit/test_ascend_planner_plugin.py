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

import kvpd
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
    out = {"planner": getattr(cpp, "__name__", cpp), "log": records, "kvpd": kvpd.__file__}
    if case.get("torch_call"):
        out["torch_call"] = torch_call(cpp)
    return out

def torch_call(cpp):
    # Call the planner the way the manager does: CPU torch tensors, the descriptor buffers as
    # int64/int32 views of one int8 buffer, slices of per-layer state; return what it wrote.
    import torch
    rows, k, cap, mml, block = 3, 16, 32, 256, 16
    g = torch.Generator().manual_seed(0)
    topk = torch.stack([torch.randperm(mml, generator=g)[:k] for _ in range(rows)]).int()
    req = torch.arange(rows, dtype=torch.int64)
    last = torch.full([rows + 2], -1, dtype=torch.int64)
    stt = torch.full([rows + 2, cap], -1, dtype=torch.int32)
    lru = torch.arange(cap, dtype=torch.int32).repeat(rows + 2, 1)
    stable = torch.full([rows], mml, dtype=torch.int32)
    cur, mt, ms = (torch.empty([rows + 2, k], dtype=torch.int32) for _ in range(3))
    mc = torch.empty([rows + 2], dtype=torch.int32)
    ws = [torch.zeros([8, mml], dtype=torch.int32), torch.full([8, mml], -1, dtype=torch.int32),
          torch.empty([8, 3 * cap], dtype=torch.int32), torch.empty([8, k], dtype=torch.int32),
          torch.zeros([8], dtype=torch.int32)]
    n = (rows + 2) * k * 2
    buf = torch.zeros([n * 8 * 2 + n * 4 + 4], dtype=torch.int8)
    gvas = buf[: n * 8].view(torch.int64)
    addr = buf[n * 8 : n * 16].view(torch.int64)
    size = buf[n * 16 : n * 20].view(torch.int32)
    num = buf[n * 20 :].view(torch.int32)
    bt = (torch.arange(rows * (mml // block), dtype=torch.int32) + 20000).reshape(rows, -1)
    ptrs = [t.data_ptr() for t in (req, last, topk, stable, stt, lru, cur, mc, mt, ms, *ws)]
    cpp.lru_resident_compact(*ptrs, rows, k, cap, mml, 8, 8)
    s = cpp.compute_lru_resident_addrs(
        mc[:rows], mt[:rows], ms[:rows], bt, block, 1024, 128, 2**50, 2**50 + 2**40, 2**44,
        2**45, cap, 8, gvas, addr, size, num)
    good = dict(mc=mc[:rows], mt=mt[:rows], ms=ms[:rows], gvas=gvas)
    bad = {"dtype": dict(mt=mt[:rows].long()), "layout": dict(mt=mt[:rows].t().contiguous().t()),
           "rank": dict(mc=mc[:rows, None]), "float": dict(gvas=gvas.double()),
           "device": dict(mc=torch.zeros([rows], dtype=torch.int32, device="meta"))}
    errors = {}
    for name, swap in bad.items():
        a = {**good, **swap}
        try:
            cpp.compute_lru_resident_addrs(
                a["mc"], a["mt"], a["ms"], bt, block, 1024, 128, 0, 0, 0, 0, cap, 8, a["gvas"],
                addr, size, num)
            errors[name] = None
        except ValueError as e:
            errors[name] = str(e)
    return {"errors": errors,
            "S": s, "num": num.tolist(), "cur": cur[:rows].tolist(), "mc": mc[:rows].tolist(),
            "mt": mt[:rows].tolist(), "ms": ms[:rows].tolist(), "gvas": gvas[: 2 * s].tolist(),
            "addr": addr[: 2 * s].tolist(), "size": size[: 2 * s].tolist(), "topk": topk.tolist()}

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
    "on": {"env": {"KVPD_SPARSE_PLANNER": "kvpd"}, "trust_stand_in": True, "torch_call": True},
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
    dist = folder / f"kvpd-{kvpd.__version__}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: kvpd\nVersion: {kvpd.__version__}\n"
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
    engine_version = subprocess.run(
        [str(ENGINE_PY), "-c", "import sys; print(sys.version_info[:2])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    if engine_version != str(sys.version_info[:2]):
        pytest.skip(
            f"the engine venv runs Python {engine_version}, this checkout's native core was "
            f"built for {sys.version_info[:2]}"
        )
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
    assert len(r["log"]) == 1
    assert r["log"][0].startswith(
        "INFO Sparse KV offload planner: kvpd's native core (kvpd.native.ascend_planner, "
    )


def test_torch_tensors_like_the_manager_passes(results) -> None:
    """The descriptors from torch tensors (views of one int8 buffer) match the reference."""
    import numpy as np

    from tests.unit import ascend_reference as ref

    r = results["on"]["torch_call"]
    rows, cap, block = 3, 32, 16
    assert r["mc"] == [16, 16, 16]
    assert r["S"] == 48
    assert r["num"] == [96]
    bt = (np.arange(rows * (256 // block), dtype=np.int32) + 20000).reshape(rows, -1)
    want = ref.compute_lru_resident_addrs(
        np.array(r["mc"]), np.array(r["mt"]), np.array(r["ms"]), bt, block, 1024, 128,
        2**50, 2**50 + 2**40, 2**44, 2**45, cap,
    )  # fmt: skip
    assert (r["gvas"], r["addr"], r["size"], r["S"]) == want
    assert r["cur"] == r["ms"]  # a fresh row: position p misses into slot p, in order
    assert r["mt"] == r["topk"]


def test_torch_tensors_are_checked_as_arrays_are(results) -> None:
    """The manager's tensors take a fast path through the C API; a tensor it cannot take (or one
    that is wrong) gets the same checks and messages as before."""
    assert results["on"]["torch_call"]["errors"] == {
        "dtype": "miss_tokens must have dtype int32, got int64",
        "layout": "miss_tokens must be C-contiguous",
        "rank": "miss_count must be 1-D, got shape (3, 1)",
        "float": "gvas must have dtype int64, got float64",
        "device": "miss_count must be on the CPU, got device meta",
    }


def test_off_unless_requested(results) -> None:
    assert results["off"] == {**results["off"], "planner": UPSTREAM, "log": []}
    assert results["upstream"]["planner"] == UPSTREAM
    assert results["upstream"]["log"] == [
        "INFO Sparse KV offload planner: vLLM-Ascend's own (JIT build; "
        "KVPD_SPARSE_PLANNER=upstream)"
    ]


def test_unknown_manager_version_keeps_upstream(results) -> None:
    r = results["unknown_version"]
    assert r["planner"] == UPSTREAM
    assert len(r["log"]) == 1
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
    assert "crash" not in r
    assert r["planner"] == UPSTREAM
    assert len(r["log"]) == 1
    assert r["log"][0].startswith("WARNING")
    assert why in r["log"][0]


def test_vllm_plugins_allow_list(results) -> None:
    assert results["allowed"]["planner"] == KVPD
    assert results["filtered_out"]["planner"] == UPSTREAM
    assert results["filtered_out"]["log"] == []


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
