"""Which host-side planner vLLM-Ascend's sparse KV offload runs on decode, and its environment.

`decode.sparse_offload.planner`: `kvpd` runs kvpd's prebuilt native core through the vLLM plugin
`kvpd_sparse_planner` (no JIT build on the host, 64-bit addresses); `upstream` leaves
vLLM-Ascend's own planner, JIT-compiled with clang + OpenMP at every decode start; `auto` is kvpd
when the bundle shipped to the host has the native core. Pure: the bundle fact is an argument.
"""

from __future__ import annotations

from typing import Literal

from kvpd.profile.schema import Group

ENV = "KVPD_SPARSE_PLANNER"  # read by kvpd/ascend_planner_plugin.py in the decode processes
PLUGIN = "kvpd_sparse_planner"  # the entry point's name, as VLLM_PLUGINS lists it

Planner = Literal["kvpd", "upstream"]


def sparse_planner(group: Group | None, native_core: bool = True) -> Planner | None:
    """The planner a group's engines run, or None when the group has no sparse offload.

    `native_core`: whether the kvpd bundle for the group's hosts carries the native core. The
    plan assumes it does (kvpd's wheel builds it wherever the platform has a C++ compiler); the
    bundle step, which knows, passes False for a platform built without it.
    """
    so = group.sparse_offload if group is not None else None
    if so is None or not so.enabled:
        return None
    if so.planner == "auto":
        return "kvpd" if native_core else "upstream"
    return so.planner


# Sparse offload refuses Model Runner V2 ("Sparse KV offload doesn't support model_runner_v2
# now"); vLLM reads this variable (vllm/envs.py) to pick the runner, and newer releases may
# default to V2, so it is rendered, not only checked.
RUNNER_ENV = ("VLLM_USE_V2_MODEL_RUNNER", "0")


def planner_env(group: Group | None, native_core: bool = True) -> dict[str, str]:
    """Environment of a group's engines for sparse offload: the planner choice and Model Runner
    V1 (empty without sparse offload)."""
    planner = sparse_planner(group, native_core)
    return {ENV: planner, RUNNER_ENV[0]: RUNNER_ENV[1]} if planner else {}
