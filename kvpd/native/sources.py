"""The native core's extensions and compile flags: one list for setup.py and the cross-build.

Imports nothing, so that setup.py can load this file by path at build time (the package itself
imports NumPy, which a build environment may not have).
"""

from __future__ import annotations

# Extension module -> its C++ sources, in link order.
EXTENSIONS: dict[str, tuple[str, ...]] = {
    "kvpd.native._sparse_lru": ("kvpd/native/sparse_lru.cpp",),
    # vLLM-Ascend's sparse-offload planner interface; its AVX2/AVX-512 (x86) and NEON (aarch64)
    # row planners are compiled with target attributes or per architecture and chosen at load
    # time, so the baseline -march stays.
    "kvpd.native._ascend_planner": (
        "kvpd/native/ascend_planner.cpp",
        "kvpd/native/ascend_planner_args.cpp",
        "kvpd/native/ascend_planner_avx512.cpp",
        "kvpd/native/ascend_planner_neon.cpp",
    ),
}

# Headers the extensions include: a change to one rebuilds them.
DEPENDS: dict[str, tuple[str, ...]] = {
    "kvpd.native._sparse_lru": ("kvpd/native/py_int_args.hpp",),
    "kvpd.native._ascend_planner": (
        "kvpd/native/ascend_planner_args.hpp",
        "kvpd/native/ascend_planner_row.hpp",
        "kvpd/native/py_int_args.hpp",
        "kvpd/native/ascend_planner_pool.hpp",
        "kvpd/native/ascend_planner_avx512.inc",
    ),
}

# The portable -march per machine: a wheel built with it runs on every CPU of that machine type.
PORTABLE_MARCH: dict[str, str] = {"x86_64": "x86-64-v2", "amd64": "x86-64-v2", "aarch64": "armv8-a"}

# Compile flags before -march, and after it; -g0 overrides the interpreter's default -g (debug
# info would make a module 5 MB). Linking: OpenMP serves the CPU count; -s strips.
BASE_FLAGS: tuple[str, ...] = ("-std=c++17", "-O3", "-fopenmp")
TAIL_FLAGS: tuple[str, ...] = ("-fvisibility=hidden",)
EXTRA_FLAGS: tuple[str, ...] = ("-g0",)
LINK_FLAGS: tuple[str, ...] = ("-fopenmp", "-s")


def isa_define(march: str) -> str:
    """The -D flag that records the ISA flags in the build (`kvpd native info`)."""
    return f'-DKVPD_ISA_FLAGS="{march or "compiler default"}"'
