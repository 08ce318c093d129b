"""Sparse-KV hot-buffer planner: the native C++/OpenMP core when built, else the NumPy fallback.

`KVPD_NATIVE=0` forces the fallback. Both give identical results; `kvpd native info` (or
`implementation_info()`) says which one is active and how it was built.
"""

from __future__ import annotations

import os
import platform
from typing import Any

IMPLEMENTATION: str
_IMPORT_ERROR: str | None = None

if os.environ.get("KVPD_NATIVE", "1") == "0":
    from kvpd.native.fallback import SparseLRUPlanner, build_copy_descriptors

    IMPLEMENTATION = "numpy"
    _IMPORT_ERROR = "disabled by KVPD_NATIVE=0"
else:
    try:
        from kvpd.native._sparse_lru import (  # type: ignore[import-not-found,no-redef]
            SparseLRUPlanner,
            build_copy_descriptors,
        )

        IMPLEMENTATION = "native"
    except ImportError as e:
        from kvpd.native.fallback import SparseLRUPlanner, build_copy_descriptors

        IMPLEMENTATION = "numpy"
        _IMPORT_ERROR = f"extension not built or not loadable ({e})"

__all__ = ["IMPLEMENTATION", "SparseLRUPlanner", "build_copy_descriptors", "implementation_info"]


def implementation_info() -> dict[str, Any]:
    """Which implementation is active, and for the native one its compiler, OpenMP and ISA."""
    info: dict[str, Any] = {
        "implementation": IMPLEMENTATION,
        "machine": platform.machine(),
        "reason": _IMPORT_ERROR,
    }
    if IMPLEMENTATION == "native":
        from kvpd.native import _sparse_lru

        info.update(_sparse_lru.build_info())
        info["module"] = _sparse_lru.__file__
    else:
        info.update(compiler=None, openmp=None, isa_flags=None, isa_features=None, max_threads=1)
    # vLLM-Ascend's planner interface (the kvpd sparse-offload planner): its own extension.
    try:
        from kvpd.native._ascend_planner import isa_info  # type: ignore[import-not-found]

        info["ascend_planner"] = isa_info()["isa"]
    except ImportError as e:
        info["ascend_planner"] = None
        info["ascend_planner_reason"] = f"extension not built or not loadable ({e})"
    return info
