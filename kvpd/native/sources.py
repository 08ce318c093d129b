"""The native core's extensions and compile flags: one list for setup.py and the cross-build.

Imports only the standard library, so that setup.py and the node's wheel builder can load this
file by path at build time (the package itself imports NumPy, which a build environment may not
have).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence

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
        "kvpd/native/ascend_planner_row64.hpp",
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


# One module to link: its sources, then the linker's argv before and after the objects.
LinkJob = tuple[Sequence[str], Sequence[str], Sequence[str]]


def compile_and_link(
    compile_argv: Sequence[str], modules: Sequence[LinkJob], obj_dir: str, *, jobs: int = 0
) -> tuple[int, str]:
    """Build extension modules: every source of every module compiled on its own
    (`compile_argv` + `-c`), up to `jobs` compilers at once (0: the CPUs this process may use),
    then each module linked (head + its objects + tail). The same modules as one compiler call
    per module over its sources (which compiles them one after another), in about the time of
    the slowest source where there are CPUs to spare. Returns (exit code, the failing step's
    output); (0, "") when every module is built."""
    os.makedirs(obj_dir, exist_ok=True)
    objects = [
        [os.path.join(obj_dir, f"{m}-{i}-{os.path.basename(f)}.o") for i, f in enumerate(files)]
        for m, (files, _, _) in enumerate(modules)
    ]
    steps = [
        [*compile_argv, "-c", f, "-o", o]
        for (files, _, _), objs in zip(modules, objects, strict=True)
        for f, o in zip(files, objs, strict=True)
    ]
    affinity = getattr(os, "sched_getaffinity", None)
    width = jobs or (len(affinity(0)) if affinity is not None else 1)
    running: list[subprocess.Popen[str]] = []
    failed: tuple[int, str] | None = None
    for argv in steps:
        if len(running) >= width:
            failed = failed or _finish(running.pop(0))
        pipe, merged = subprocess.PIPE, subprocess.STDOUT
        running.append(subprocess.Popen(argv, stdout=pipe, stderr=merged, text=True))
    for proc in running:
        failed = failed or _finish(proc)
    if failed is not None:
        return failed
    for (_, head, tail), objs in zip(modules, objects, strict=True):
        done = subprocess.run([*head, *objs, *tail], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            return done.returncode, done.stdout + done.stderr
    return 0, ""


def _finish(proc: subprocess.Popen[str]) -> tuple[int, str] | None:
    out, _ = proc.communicate()
    return (proc.returncode, out or "") if proc.returncode != 0 else None
