"""The native core cross-built on the controller for hosts of another machine type (aarch64).

Ascend servers run aarch64 host CPUs (Kunpeng). A node without a compiler still gets kvpd's
native core when the controller has a cross compiler and the target's Python headers: the
extensions are compiled here with the same sources and flags as setup.py (kvpd/native/sources.py)
and the portable -march of the target, so the module runs on every CPU of that machine type.

One command installs what this needs on a Debian/Ubuntu controller (as root):
`bash scripts/install-aarch64.sh` (g++-aarch64-linux-gnu, qemu-user-static, and the arm64 Python
headers and interpreter in `.kvpd/aarch64`, for the tests under emulation). On a controller with
multiarch set up, `apt-get install g++-aarch64-linux-gnu libpython3.11-dev:arm64` is enough.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from kvpd.native import sources

CrossMachine = Literal["aarch64"]
INSTALL_HINT = (
    "install a cross toolchain on the controller: `bash scripts/install-aarch64.sh` as root "
    "(or `dpkg --add-architecture arm64 && apt-get update && apt-get install "
    "g++-aarch64-linux-gnu libpython3.11-dev:arm64`)"
)


class CrossBuildError(RuntimeError):
    """A cross compile that failed: the command's last lines of output, and what to do."""


@dataclass(frozen=True)
class CrossTarget:
    """A machine type the controller can build for, by its GNU triple."""

    machine: CrossMachine
    triple: str

    @property
    def compiler_name(self) -> str:
        return f"{self.triple}-g++"

    @property
    def march(self) -> str:
        return sources.PORTABLE_MARCH[self.machine]

    def suffix(self, python: str) -> str:
        """The extension-module suffix CPython `python` ("3.11") uses on this target."""
        major, minor = python.split(".")
        return f".cpython-{major}{minor}-{self.triple}.so"


TARGETS: dict[CrossMachine, CrossTarget] = {
    "aarch64": CrossTarget(machine="aarch64", triple="aarch64-linux-gnu"),
}


@dataclass(frozen=True)
class CrossToolchain:
    """A cross compiler and the include folders the extensions need for one target Python."""

    target: CrossTarget
    python: str  # "3.11"
    compiler: Path
    includes: tuple[Path, ...]


def default_sysroot() -> Path:
    """Where scripts/install-aarch64.sh puts the arm64 Python (KVPD_AARCH64_DIR overrides)."""
    env = os.environ.get("KVPD_AARCH64_DIR", "").strip()
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / ".kvpd" / "aarch64"


def _python_includes(target: CrossTarget, python: str, sysroot: Path) -> tuple[Path, ...] | None:
    """The folders holding Python.h and the target's pyconfig.h, or None."""
    name = f"python{python}"
    for usr in (sysroot / "root" / "usr", Path("/usr")):
        generic, arch = usr / "include" / name, usr / "include" / target.triple / name
        if (generic / "Python.h").is_file() and (arch / "pyconfig.h").is_file():
            # Debian's generic pyconfig.h includes <triple/pythonX.Y/pyconfig.h>: `usr/include`
            # must be on the path too.
            return (generic, usr / "include")
    return None


def find_toolchain(
    machine: CrossMachine, python: str = "3.11", sysroot: Path | None = None
) -> CrossToolchain | str:
    """The cross toolchain for `machine`, or why there is none and how to install it."""
    target = TARGETS[machine]
    compiler = shutil.which(target.compiler_name)
    if compiler is None:
        return f"no {target.compiler_name} on the controller; {INSTALL_HINT}"
    includes = _python_includes(target, python, sysroot or default_sysroot())
    if includes is None:
        return f"no {machine} headers of Python {python} on the controller; {INSTALL_HINT}"
    try:
        import pybind11  # the controller's build dependency; its headers are portable
    except ImportError:
        return "pybind11 is not installed in kvpd's environment (pip install pybind11)"
    extra = (Path(pybind11.get_include()),)
    return CrossToolchain(target, python, Path(compiler), extra + includes)


def compile_flags(chain: CrossToolchain) -> list[str]:
    """The compiler's argv for one source of an extension module, without the source (setup.py's
    flags, the target's -march)."""
    march = f"-march={chain.target.march}"
    incs = [f"-I{p}" for p in chain.includes]
    return [
        str(chain.compiler),
        *sources.BASE_FLAGS,
        march,
        *sources.TAIL_FLAGS,
        *sources.EXTRA_FLAGS,
        sources.isa_define(march),
        "-fPIC",
        *incs,
    ]


def build_native(
    chain: CrossToolchain,
    out_dir: Path,
    source_root: Path | None = None,
    modules: Sequence[str] | None = None,
) -> list[Path]:
    """Compile the native extensions for the toolchain's target into `out_dir`/kvpd/native.

    `source_root` is the folder holding the `kvpd` package whose sources are built (default:
    this kvpd). Every source compiles on its own, as many at once as this controller has CPUs,
    then each module links. Returns the built module files; raises CrossBuildError on a failed
    compile.
    """
    root = source_root or Path(__file__).resolve().parents[2]
    names = list(modules or sources.EXTENSIONS)
    built, jobs = [], []
    for module in names:
        rel = Path(*module.split("."))
        out = out_dir / rel.parent / f"{rel.name}{chain.target.suffix(chain.python)}"
        out.parent.mkdir(parents=True, exist_ok=True)
        files = [str(root / s) for s in sources.EXTENSIONS[module]]
        tail = [*sources.LINK_FLAGS, "-o", str(out)]
        jobs.append((files, [str(chain.compiler), "-shared"], tail))
        built.append(out)
    with tempfile.TemporaryDirectory(prefix="kvpd-cross-") as objs:
        code, text = sources.compile_and_link(compile_flags(chain), jobs, objs)
    if code != 0:
        tail_text = "\n".join(text.strip().splitlines()[-15:])
        raise CrossBuildError(
            f"cross-compiling {', '.join(names)} for {chain.target.machine} failed "
            f"(exit {code}):\n{tail_text}"
        )
    return built


def platform_target(platform: str) -> tuple[CrossMachine, str] | None:
    """(machine, Python "X.Y") of a bundle platform key (a CPython SOABI such as
    `cpython-311-aarch64-linux-gnu`) that the controller knows how to cross-build for."""
    parts = platform.split("-", 2)
    if len(parts) != 3 or parts[0] != "cpython" or not parts[1].isdigit() or len(parts[1]) < 2:
        return None
    for machine, target in TARGETS.items():
        if parts[2] == target.triple:
            return machine, f"{parts[1][0]}.{parts[1][1:]}"
    return None


def wheel_tag(chain: CrossToolchain) -> str:
    """The wheel tag of a cross-built bundle: cp311-cp311-linux_aarch64."""
    py = "cp" + chain.python.replace(".", "")
    return f"{py}-{py}-linux_{chain.target.machine}"


def build_wheel(chain: CrossToolchain, src: Path, out: Path) -> dict[str, object]:
    """Cross-compile the native core and pack the node wheel of the prepared source tree `src`
    (kvpd.exec.bundle.wheel.write_source) into `out`: wheel_build.py's result line, as a dict."""
    import json
    import sys

    modules = out / "modules"
    built = build_native(chain, modules, source_root=src)
    argv = [sys.executable, "-I", str(src / "wheel_build.py"), str(src), str(out / "wheel")]
    argv += ["--prebuilt", str(built[0].parent), "--tag", wheel_tag(chain)]
    argv += ["--why", f"cross-built on the controller with {chain.compiler.name} "
             f"-march={chain.target.march}"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False)
    if done.returncode != 0:
        raise CrossBuildError(f"packing the {chain.target.machine} wheel failed: "
                              f"{done.stderr.strip()[-500:]}")  # fmt: skip
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def buildable(platforms: list[str]) -> frozenset[str]:
    """The bundle platforms among `platforms` this controller has a cross toolchain for."""
    able = set()
    for p in platforms:
        target = platform_target(p)
        if target is not None and not isinstance(find_toolchain(*target), str):
            able.add(p)
    return frozenset(able)
