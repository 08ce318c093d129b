"""Builds kvpd's optional native core (kvpd.native._sparse_lru, ._ascend_planner); metadata lives in pyproject.toml.

The extension is optional: without a C++17 compiler with OpenMP (or without pybind11), the build
prints why and installs kvpd without it, and kvpd.native falls back to NumPy.

Environment:
  KVPD_NATIVE_BUILD=0        skip the extension.
  KVPD_NATIVE_MARCH=<arch>   replace the portable -march (x86-64-v2 / armv8-a), e.g. "native"
                             for a build that runs only on CPUs like the build machine.
  KVPD_NATIVE_REQUIRED=1     fail the install instead of skipping the extension (CI).
"""

from __future__ import annotations

import importlib.util
import os
import platform
import shutil
import sys
import tempfile
from pathlib import Path
from types import ModuleType

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


def _load_sources() -> ModuleType:
    # By path: importing the package would import NumPy, which the build may not have.
    spec = importlib.util.spec_from_file_location("_kvpd_native_sources", "kvpd/native/sources.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_SRC = _load_sources()
_PORTABLE_MARCH = _SRC.PORTABLE_MARCH
_OPENMP_PROBE = """
#include <omp.h>
int main() {
  int n = 0;
#pragma omp parallel reduction(+ : n)
  n += 1;
  return n > 0 ? 0 : 1;
}
"""


def _say(msg: str) -> None:
    # pip shows a build's stderr only with -v, but this warning is worth seeing in the log.
    print(f"kvpd native build: {msg}", file=sys.stderr)


def _march_flags() -> list[str]:
    march = os.environ.get("KVPD_NATIVE_MARCH", "").strip()
    if not march:
        march = _PORTABLE_MARCH.get(platform.machine().lower(), "")
    return [f"-march={march}"] if march else []


class OptionalBuildExt(build_ext):
    """build_ext that probes for a working C++17 + OpenMP toolchain and never fails the install
    unless KVPD_NATIVE_REQUIRED=1."""

    def run(self) -> None:
        if os.environ.get("KVPD_NATIVE_BUILD", "1") == "0":
            _say("skipped (KVPD_NATIVE_BUILD=0); kvpd will use the NumPy fallback.")
            return
        try:
            super().run()
        except Exception as e:  # noqa: BLE001 - any toolchain failure means "no extension"
            self._give_up(f"could not build the extension ({e})")

    def build_extension(self, ext: Extension) -> None:
        try:
            import pybind11
        except ImportError:
            self._give_up("pybind11 is not installed (pip install pybind11)")
            return
        ext.include_dirs.append(pybind11.get_include())
        flags = self._probe_flags()
        if flags is None:
            return
        isa = " ".join(f for f in flags if f.startswith("-march"))
        ext.extra_compile_args = [*flags, *_SRC.EXTRA_FLAGS, _SRC.isa_define(isa)]
        link = list(_SRC.LINK_FLAGS)
        ext.extra_link_args = link if sys.platform == "linux" else [f for f in link if f != "-s"]
        try:
            super().build_extension(ext)
        except Exception as e:  # noqa: BLE001
            self._give_up(f"compiling {' '.join(ext.sources)} failed ({e})")
            return
        _say(f"built {ext.name} with {' '.join(flags)}")

    def _probe_flags(self) -> list[str] | None:
        """Compile and link a tiny OpenMP program; returns the flags to use or None."""
        for march in (_march_flags(), []):
            flags = [*_SRC.BASE_FLAGS, *march, *_SRC.TAIL_FLAGS]
            if self._try_compile(flags):
                if not march and _march_flags():
                    _say(f"the compiler rejects {_march_flags()[0]}; building without it")
                return flags
        self._give_up(
            "no working C++17 compiler with OpenMP was found (on Debian/Ubuntu: "
            "apt-get install g++ ; with clang also libomp-dev)"
        )
        return None

    def _try_compile(self, flags: list[str]) -> bool:
        tmp = Path(tempfile.mkdtemp(prefix="kvpd-omp-"))
        try:
            src = tmp / "probe.cpp"
            src.write_text(_OPENMP_PROBE)
            objs = self.compiler.compile([str(src)], output_dir=str(tmp), extra_postargs=flags)
            self.compiler.link_executable(
                objs, "probe", output_dir=str(tmp), extra_postargs=["-fopenmp"]
            )
            return True
        except Exception:  # noqa: BLE001 - the probe failing is the answer
            return False
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def _give_up(self, why: str) -> None:
        if os.environ.get("KVPD_NATIVE_REQUIRED") == "1":
            raise RuntimeError(f"kvpd native build: {why} (KVPD_NATIVE_REQUIRED=1)")
        _say(
            f"{why}; installing without it. kvpd.native will use the NumPy fallback "
            "(same results, several times slower); `kvpd native info` shows which is active."
        )


setup(
    ext_modules=[
        Extension(name, list(sources), depends=list(_SRC.DEPENDS[name]), language="c++")
        for name, sources in _SRC.EXTENSIONS.items()
    ],
    cmdclass={"build_ext": OptionalBuildExt},
)
