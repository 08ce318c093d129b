"""vLLM general plugin: kvpd's native core as vLLM-Ascend's sparse-offload planner.

Entry point `kvpd_sparse_planner` in the group `vllm.general_plugins` (pyproject.toml). vLLM calls
`register()` in every process it starts. With `KVPD_SPARSE_PLANNER=kvpd` in the environment, it
arranges that vLLM-Ascend's `SparseKVOffloadManager._build_cpp` (which JIT-compiles the planner
with torch's cpp_extension at every decode start) sets `self.sparse_kv_offload_cpp` to
`kvpd.native.ascend_planner` instead: same functions and arguments, prebuilt, no compiler.

Rules, because this runs inside someone else's server:
- it never raises: vLLM lets an exception from `register()` take the process down;
- it acts only on a manager it knows: the manager's source file must be a recorded version (git
  blob id), or the planner source next to it must be the recorded one and the manager must still
  have `_build_cpp` and `_onload_topk_kv_cpu` (the interface kvpd implements is that .cpp's);
- on any doubt it leaves vLLM-Ascend's own path, and says so in one log line; when it does act,
  one line says that kvpd's planner runs; with `KVPD_SPARSE_PLANNER=upstream` one line says
  that vLLM-Ascend's runs (in the process that loads the manager).
- Import time touches only the standard library; the manager is patched when vLLM-Ascend imports
  it (an import hook), so loading this plugin imports neither torch nor vLLM-Ascend.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.util
import logging
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

ENV = "KVPD_SPARSE_PLANNER"
PLUGIN_NAME = "kvpd_sparse_planner"
MANAGER_MODULE = "vllm_ascend.distributed.kv_transfer.sparse_kv_offload.sparse_kv_offload_manager"
# Git blob ids (sha1 of "blob <size>\0" + bytes) of versions whose planner interface
# kvpd.native.ascend_planner implements (shared/reference/vllm-ascend.md §2.1).
KNOWN_MANAGER_BLOBS = {
    "b37cf9451eaf082ee04c83a7e765cac270c1d284": "vllm-ascend main 182b75ea / releases/v0.26.0rc",
}
KNOWN_PLANNER_CPP_BLOBS = {
    "5a9b0ee6a3364fb2c64162ff3e187230b048d541": "vllm-ascend main 182b75ea / releases/v0.26.0rc",
}

# A child of vLLM's logger, so the line shows up in vLLM's log format and handlers.
log = logging.getLogger("vllm.kvpd_sparse_planner")


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def register() -> None:
    """vLLM's entry point. Never raises."""
    try:
        _register()
    except Exception as e:  # noqa: BLE001 - a plugin must not take vLLM down
        log.warning("Sparse KV offload planner: vLLM-Ascend's own (kvpd plugin failed: %r)", e)


def _register() -> None:
    want = os.environ.get(ENV, "").strip().lower()
    if not want:
        log.debug("kvpd sparse planner not requested (%s unset)", ENV)
        return
    if want == "upstream":  # say so where the manager loads, not in every vLLM process
        _install_hook(log_only=True)
        return
    if want != "kvpd":
        log.warning(
            "Sparse KV offload planner: vLLM-Ascend's own (%s=%r is not 'kvpd' or 'upstream')",
            ENV,
            want,
        )
        return
    _install_hook(log_only=False)


def _install_hook(log_only: bool) -> None:
    module = sys.modules.get(MANAGER_MODULE)
    if module is not None:  # already imported: act now
        _on_manager(module, getattr(module, "__file__", None), log_only)
        return
    if not any(isinstance(f, _ManagerImportHook) for f in sys.meta_path):
        sys.meta_path.insert(0, _ManagerImportHook(log_only))


def _on_manager(module: ModuleType, origin: str | None, log_only: bool) -> None:
    if log_only:
        log.info("Sparse KV offload planner: vLLM-Ascend's own (JIT build; %s=upstream)", ENV)
        return
    patch_manager(module, origin)


def version_gate(origin: str | None) -> str | None:
    """Why the manager at `origin` is not a version kvpd knows, or None when it is."""
    if not origin:
        return "the manager module has no source file to check"
    path = Path(origin)
    try:
        blob = git_blob_id(path.read_bytes())
    except OSError as e:
        return f"cannot read {path}: {e}"
    if blob in KNOWN_MANAGER_BLOBS:
        return None
    cpp = path.with_name("sparse_kv_offload.cpp")
    try:
        cpp_blob = git_blob_id(cpp.read_bytes())
    except OSError:
        cpp_blob = None
    if cpp_blob in KNOWN_PLANNER_CPP_BLOBS:
        return None  # the manager changed, the planner interface did not (checked in the probe)
    return (
        f"unknown vLLM-Ascend manager version (blob {blob[:12]}, planner source "
        f"{cpp_blob[:12] if cpp_blob else 'absent'}); kvpd knows "
        f"{', '.join(sorted(set(KNOWN_MANAGER_BLOBS.values())))}"
    )


def patch_manager(module: ModuleType, origin: str | None) -> bool:
    """Replace the manager's `_build_cpp` if the version gate and the probe pass. Never raises."""
    try:
        why = version_gate(origin)
        cls = getattr(module, "SparseKVOffloadManager", None)
        if why is None:
            missing = [a for a in ("_build_cpp", "_onload_topk_kv_cpu") if not hasattr(cls, a)]
            if cls is None or missing:
                why = f"the manager lacks {'SparseKVOffloadManager' if cls is None else missing}"
        if why is None and cls is not None:
            from kvpd.native import ascend_planner  # ImportError when the core is not built

            original = cls._build_cpp
            cls._build_cpp = _make_build_cpp(original, ascend_planner)
            log.debug("kvpd sparse planner: patched %s._build_cpp", MANAGER_MODULE)
            return True
    except Exception as e:  # noqa: BLE001
        why = f"{type(e).__name__}: {e}"
    log.warning("Sparse KV offload planner: vLLM-Ascend's own (JIT build); kvpd: %s", why)
    return False


def _make_build_cpp(original: Any, planner: ModuleType) -> Any:
    def _build_cpp(self: Any) -> None:
        try:
            self.sparse_kv_offload_cpp = planner
            info = planner.isa_info()
            log.info(
                "Sparse KV offload planner: kvpd's native core (%s, %s row planner), no JIT build",
                planner.__name__,
                info.get("isa"),
            )
        except Exception as e:  # noqa: BLE001
            log.warning("Sparse KV offload planner: vLLM-Ascend's own (JIT build); kvpd: %r", e)
            original(self)

    _build_cpp.__kvpd_original__ = original  # type: ignore[attr-defined]
    _build_cpp.__doc__ = "kvpd: use kvpd.native.ascend_planner instead of the JIT build."
    return _build_cpp


class _ManagerImportHook(importlib.abc.MetaPathFinder):
    """Finds the manager module through the other finders and patches it right after it runs."""

    def __init__(self, log_only: bool) -> None:
        self._log_only = log_only

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != MANAGER_MODULE:
            return None
        try:
            spec = None
            for finder in sys.meta_path:  # whoever would find it (path, editable installs)
                find = getattr(finder, "find_spec", None)
                if finder is self or find is None:
                    continue
                spec = find(fullname, path, target)
                if spec is not None:
                    break
            if spec is None or spec.loader is None:
                return None
            spec.loader = _PatchingLoader(spec.loader, spec.origin, self._log_only)
            return spec
        except Exception as e:  # noqa: BLE001
            log.warning("Sparse KV offload planner: vLLM-Ascend's own; kvpd import hook: %r", e)
            return None


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, inner: Any, origin: str | None, log_only: bool) -> None:
        self._inner, self._origin, self._log_only = inner, origin, log_only

    def create_module(self, spec: Any) -> Any:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)  # the manager's own errors are the manager's
        try:
            _on_manager(module, self._origin, self._log_only)
        except Exception as e:  # noqa: BLE001 - never break the manager's import
            log.warning("Sparse KV offload planner: vLLM-Ascend's own; kvpd: %r", e)

    def __getattr__(self, name: str) -> Any:  # get_source, get_code, ... for inspect/linecache
        return getattr(self._inner, name)
