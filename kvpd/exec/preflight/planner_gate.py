"""Preflight: which sparse-offload planner each decode host will really run.

With `KVPD_SPARSE_PLANNER=kvpd` the plugin (kvpd/ascend_planner_plugin.py) replaces
vLLM-Ascend's planner only on a manager version it recognises; on any other version vLLM-Ascend
JIT-compiles its own planner at decode start, and a host without clang and `omp.h` then loses
its decode. So preflight runs the plugin's own recognition (the same function, sent as source)
with the decode's Python against the manager installed there, says which planner the host will
run, and requires the compiler exactly where that is vLLM-Ascend's. The manager's file is found
without importing vLLM-Ascend (which would import torch): `find_spec` of the top-level package
only locates it.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable

from kvpd import ascend_planner_plugin as plugin
from kvpd.exec.preflight.checks import Check
from kvpd.exec.preflight.probe import clang_omp
from kvpd.exec.transport import Transport
from kvpd.plan.requirements import python_of
from kvpd.plan.sparse_planner import ENV
from kvpd.plan.value import Interpreter, Plan, ProcessSpec

# Path of the manager inside the vllm_ascend package (plugin.MANAGER_MODULE without the package).
_MANAGER_REL = plugin.MANAGER_MODULE.split(".", 1)[1].replace(".", "/") + ".py"


def gate_script() -> str:
    """The check as one script: the plugin's recognition with the versions it knows now."""
    return (
        "from __future__ import annotations\n"
        "import hashlib, importlib.util, json, os, subprocess, sys\n"
        "from pathlib import Path\n"
        f"KNOWN_MANAGER_BLOBS = {plugin.KNOWN_MANAGER_BLOBS!r}\n"
        f"KNOWN_PLANNER_CPP_BLOBS = {plugin.KNOWN_PLANNER_CPP_BLOBS!r}\n"
        + inspect.getsource(plugin.git_blob_id)
        + inspect.getsource(plugin.version_gate)
        + inspect.getsource(clang_omp)
        + r"""
out = {}
try:
    spec = importlib.util.find_spec("vllm_ascend")
except Exception as e:
    spec = None
    out["why"] = "cannot look up vllm_ascend: %r" % (e,)
if spec is not None and spec.submodule_search_locations:
    origin = os.path.join(list(spec.submodule_search_locations)[0], sys.argv[1])
    out["manager"] = origin
    if os.path.exists(origin):
        out["why"] = version_gate(origin)
    else:
        out["why"] = "%s does not exist (a vLLM-Ascend without sparse KV offload?)" % origin
elif "why" not in out:
    out["why"] = "vllm_ascend is not importable by this Python"
out.update(clang_omp())
print(json.dumps(out))
"""
    )


CLANG_FIX = "apt-get install -y clang libomp-dev"


def _planner(p: ProcessSpec) -> str | None:
    return dict(p.env).get(ENV)


def planner_checks(
    plan: Plan, transports: Callable[[str], Transport], reached: set[str]
) -> list[Check]:
    """Per decode host with sparse offload (once per Python): the planner it will run and,
    where that is vLLM-Ascend's JIT build, clang + `omp.h`."""
    checks: list[Check] = []
    seen: set[tuple[str, str]] = set()
    for p in plan.processes:
        want = _planner(p)
        if want is None or p.host not in reached or not p.command or p.substituted:
            continue  # a rehearsal's stand-in for the decode runs no vLLM-Ascend
        python = python_of(p.command[0])
        if (p.host, python.key()) in seen:
            continue
        seen.add((p.host, python.key()))
        if want == "upstream":  # the requirements already ask for the compiler here
            detail = f"vLLM-Ascend's own (JIT build at decode start; {ENV}=upstream)"
            checks.append(Check(p.host, "sparse planner", True, detail))
            continue
        checks += _judge_kvpd(p.host, python, transports(p.host))
    return checks


def _gate_argv(python: Interpreter) -> list[str]:
    if python.path is not None:
        return [python.path, "-c", gate_script(), _MANAGER_REL]
    # the interpreter next to a console script on the host's PATH, as the package probe finds it
    find = 'exec "$(dirname "$(readlink -f "$(command -v "$1")")")/python" -c "$2" "$3"'
    return ["sh", "-c", find, "sh", python.next_to or "", gate_script(), _MANAGER_REL]


def _judge_kvpd(host: str, python: Interpreter, t: Transport) -> list[Check]:
    label = python.label
    try:
        r = t.run(_gate_argv(python), timeout_s=60)
        info = json.loads(r.stdout) if r.ok else {"why": f"probe failed: {r.stderr[-200:]}"}
    except Exception as e:  # noqa: BLE001 - an unreadable answer is a doubt like any other
        info = {"why": f"probe failed: {e}"}
    why = info.get("why")
    if why is None:
        return [Check(host, "sparse planner", True,
                      f"kvpd's native core (python {label}: the installed vLLM-Ascend manager "
                      "is a version the plugin knows)")]  # fmt: skip
    out = [Check(host, "sparse planner", True,
                 f"vLLM-Ascend's own, JIT-built at decode start: the kvpd plugin will not act "
                 f"({why})")]  # fmt: skip
    ok = bool(info.get("clang") and info.get("omp_h"))
    out.append(Check.judged(host, "clang + omp.h", ok, "found (for vLLM-Ascend's JIT planner)",
                            "missing, and vLLM-Ascend will JIT-compile its planner here",
                            f"{CLANG_FIX}, or install a vLLM-Ascend version kvpd's planner "
                            "knows"))  # fmt: skip
    return out
