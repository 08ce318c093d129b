"""The node side of kvpd imports nothing but the standard library, NumPy and what the engine
already has (vLLM, torch): the node bundle is installed without dependencies.

Every module of the node-side packages is imported in a fresh `python -I` whose import system
refuses, for imports made by kvpd's own code, any top-level package other than those. Imports
made inside vLLM or torch are theirs and not policed. With the engine's Python (a venv without
kvpd, see scripts/install-engine.sh) the modules that need vLLM are imported too; elsewhere they
are reported as needing the engine and only the rest is checked.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# Packages whose modules run in node processes (engines, proxy) and the scripts `up` runs there.
NODE_PACKAGES = ("kvpd/connectors", "kvpd/native", "kvpd/proxy", "kvpd/plugin")
NODE_SCRIPTS = ("kvpd/exec/bundle/node.py", "kvpd/exec/bundle/wheel_build.py")
ALLOWED = {"kvpd", "numpy", "vllm", "torch", "uvloop"}  # uvloop: optional, guarded by the proxy

BLOCKER = r"""
import importlib.abc, json, sys
repo, allowed, modules = sys.argv[1], set(json.loads(sys.argv[2])), json.loads(sys.argv[3])
allowed |= set(sys.stdlib_module_names)

class NodeSideOnly(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top in allowed:
            return None
        f = sys._getframe(1)
        skip = ("importlib", "_frozen")
        while f is not None and f.f_globals.get("__name__", "").startswith(skip):
            f = f.f_back
        caller = f.f_globals.get("__name__", "") if f is not None else ""
        if caller.startswith("kvpd"):
            raise ImportError(f"node side: {caller} imports {name}", name=name)
        return None

sys.meta_path.insert(0, NodeSideOnly())
sys.path.insert(0, repo)
out = {}
for m in modules:
    try:
        __import__(m)
        out[m] = "ok"
    except ImportError as e:
        msg = str(e)
        if msg.startswith("node side:"):
            out[m] = msg
        elif e.name and e.name.partition(".")[0] in ("vllm", "torch"):
            out[m] = "needs the engine"
        else:
            out[m] = "error: " + msg
    except Exception as e:
        out[m] = f"error: {e!r}"
print(json.dumps(out))
"""


def node_modules() -> list[str]:
    out = []
    for pkg in NODE_PACKAGES:
        for path in sorted((REPO / pkg).glob("**/*.py")) if (REPO / pkg).is_dir() else []:
            mod = path.relative_to(REPO).with_suffix("").as_posix().replace("/", ".")
            out.append(mod.removesuffix(".__init__"))
    out += [s.removesuffix(".py").replace("/", ".") for s in NODE_SCRIPTS]
    return out


def engine_python() -> str | None:
    venv = os.environ.get("KVPD_ENGINE_VENV") or str(REPO / ".venv-engine")
    py = Path(venv) / "bin" / "python"
    return str(py) if py.exists() else None


def run(python: str, modules: list[str]) -> dict[str, str]:
    r = subprocess.run(
        [python, "-I", "-c", BLOCKER, str(REPO), json.dumps(sorted(ALLOWED)), json.dumps(modules)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd="/",
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_node_side_modules_are_found() -> None:
    mods = node_modules()
    assert "kvpd.connectors.store" in mods
    assert "kvpd.proxy.app" in mods
    assert "kvpd.native" in mods
    assert "kvpd.exec.bundle.node" in mods


def test_node_side_imports_only_stdlib_numpy_and_the_engine() -> None:
    result = run(sys.executable, node_modules())
    bad = {m: r for m, r in result.items() if r not in ("ok", "needs the engine")}
    assert not bad, bad
    assert result["kvpd.proxy.app"] == "ok"
    assert result["kvpd.native"] == "ok"


def test_the_blocker_refuses_orchestrator_packages() -> None:
    """The check has teeth: kvpd's orchestrator modules are refused under the same rules."""
    result = run(sys.executable, ["kvpd.profile.schema", "kvpd.cli.main"])
    want = "node side: kvpd.profile.schema imports pydantic"
    assert result["kvpd.profile.schema"].startswith(want)
    assert result["kvpd.cli.main"].startswith("node side:")


def test_node_side_with_the_engine_python() -> None:
    py = engine_python()
    if py is None:
        pytest.skip("no engine venv (make engine): vLLM-side modules not imported")
    result = run(py, node_modules())
    bad = {m: r for m, r in result.items() if r != "ok"}
    assert not bad, bad


REHEARSAL_CONNECTOR_CHECK = """
import json, shutil, tempfile, types
from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import ReqMeta
from kvpd.connectors.example_rehearsal import KvpdExampleConnector

c = KvpdExampleConnector.__new__(KvpdExampleConnector)
c._block_size = 32
c._storage_path = tempfile.mkdtemp()
rows = []
for n in (33, 95, 96, 97, 128, 129, 130, 161):
    tokens = list(range(1000 + n, 1000 + 2 * n))  # another prompt for each length
    req = types.SimpleNamespace(prompt_token_ids=tokens, mm_features=[])
    before = c.get_num_new_matched_tokens(req, 0)[0]
    # what ExampleConnector's store of this prompt writes: the file of its first layer
    meta = ReqMeta.make_meta(tokens, list(range(8)), 32, True, [])
    c._generate_filename_debug("layer.0", meta.token_ids, [])
    stored = len(meta.token_ids)
    rows.append({
        "len": n, "stored": stored, "before": before,
        "cold": c.get_num_new_matched_tokens(req, 0)[0],
        "half": c.get_num_new_matched_tokens(req, 32)[0],
        "local": c.get_num_new_matched_tokens(req, stored)[0],
        "found": c._found_match_for_prompt(tokens, []),
    })
shutil.rmtree(c._storage_path)  # the folders _generate_filename_debug made
print(json.dumps(rows))
"""


def test_the_rehearsal_connector_finds_a_prompt_under_the_key_it_stored_it() -> None:
    # vLLM's ExampleConnector stores a 129-token prompt (block 32) under its first 128 tokens but
    # looks it up under its first 96: another engine or DP rank never finds it, and an engine
    # holding it in its own prefix cache got a negative count (-32), on which vLLM's metrics
    # logger stops the API server. kvpd's subclass looks up, counts and stores by one key.
    py = engine_python()
    if py is None:
        pytest.skip("no engine venv (make engine): vLLM-side modules not imported")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([py, "-c", REHEARSAL_CONNECTOR_CHECK], env=env, capture_output=True,
                          text=True, timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(done.stdout.strip().splitlines()[-1])
    for row in rows:
        whole = (row["len"] - 1) // 32 * 32  # whole blocks of all tokens but the last
        assert row == {
            "len": row["len"],
            "stored": whole,
            "before": 0,
            "cold": whole,
            "half": whole - 32,
            "local": 0,
            "found": True,
        }, row
