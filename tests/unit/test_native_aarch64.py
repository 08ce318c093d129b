"""kvpd's native core cross-built for aarch64 on this controller, tested under qemu.

The cross-build (kvpd/exec/cross_build.py) compiles both extensions with the aarch64 cross
compiler and packs the node wheel (once for the module); an arm64 CPython with NumPy
(scripts/install-aarch64.sh) then runs the native unit tests (test_native.py,
test_ascend_planner.py) from that wheel under qemu-aarch64-static, unchanged: the same
reference checks as on x86, on every row-planner path the emulated CPU offers (NEON, baseline).
Only correctness is measured under emulation, never time.

The drop-in equivalence with vLLM-Ascend's own planner runs here too: upstream's
`sparse_kv_offload.cpp`, from the copy the user names with KVPD_UPSTREAM_PLANNER_CPP, is
cross-compiled for aarch64 (-mcpu=tsv110: Kunpeng 920's core, what -march=native picks there)
and both modules plan the same traces under qemu (tests/unit/upstream_equivalence.py). Without
that source it skips saying how to fetch it, in CI too (CI cannot fetch it).

Without the toolchain (not root, no apt) the tests skip saying why; in CI (CI=true) they fail
instead, so a green CI means they ran.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from kvpd.exec import cross_build

REPO = Path(__file__).resolve().parents[2]
EMULATED = cross_build.default_sysroot() / "bin" / "python3.11"
# The native tests and the pure modules they import, copied beside the cross-built modules.
TEST_FILES = (
    "tests/__init__.py",
    "tests/unit/__init__.py",
    "tests/unit/test_native.py",
    "tests/unit/native_reference.py",
    "tests/unit/test_ascend_planner.py",
    "tests/unit/ascend_reference.py",
    "tests/unit/upstream_equivalence.py",
)
NATIVE_TESTS = ("tests/unit/test_native.py", "tests/unit/test_ascend_planner.py")


def _unavailable() -> str | None:
    chain = cross_build.find_toolchain("aarch64")
    if isinstance(chain, str):
        return chain
    if shutil.which("qemu-aarch64-static") is None:
        return "qemu-aarch64-static is missing (bash scripts/install-aarch64.sh, as root)"
    if not EMULATED.exists():
        return f"{EMULATED} is missing (bash scripts/install-aarch64.sh, as root)"
    return None


def _need_toolchain() -> cross_build.CrossToolchain:
    why = _unavailable()
    if why is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the aarch64 tests: {why}")
        pytest.skip(why)
    chain = cross_build.find_toolchain("aarch64")
    assert not isinstance(chain, str)
    return chain


@pytest.fixture(scope="module")
def cross_wheel(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, object]]:
    """The node wheel an aarch64 host gets from this controller, cross-built once for the
    module: (its file, wheel_build's result)."""
    from kvpd.exec.bundle import wheel

    chain = _need_toolchain()
    work = tmp_path_factory.mktemp("cross-wheel")
    wheel.write_source(work / "src")
    res = cross_build.build_wheel(chain, work / "src", work / "out")
    return Path(str(res["wheel"])), res


@pytest.fixture(scope="module")
def aarch64_tree(
    tmp_path_factory: pytest.TempPathFactory, cross_wheel: tuple[Path, dict[str, object]]
) -> Path:
    """A kvpd tree with the aarch64 native modules (from the cross-built wheel) and the native
    tests, for the emulator."""
    import zipfile

    tree = tmp_path_factory.mktemp("aarch64")
    native = tree / "kvpd" / "native"
    native.mkdir(parents=True)
    with zipfile.ZipFile(cross_wheel[0]) as z:
        for name in z.namelist():
            if name.startswith("kvpd/native/") and name.endswith(".so"):
                (native / Path(name).name).write_bytes(z.read(name))
    assert {p.name for p in native.glob("*.so")} == {
        "_sparse_lru.cpython-311-aarch64-linux-gnu.so",
        "_ascend_planner.cpython-311-aarch64-linux-gnu.so",
    }
    for py in ("__init__.py", "errors.py"):  # errors: kvpd.native.trace's one kvpd import
        shutil.copy(REPO / "kvpd" / py, tree / "kvpd" / py)
    for py in (REPO / "kvpd" / "native").glob("*.py"):
        shutil.copy(py, native / py.name)
    for rel in TEST_FILES:
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / rel, tree / rel)
    return tree


def _emulated(tree: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1", **env}
    environ.pop("KVPD_NATIVE_ISA", None)
    return subprocess.run(
        [str(EMULATED), *args], cwd=tree, env=environ, capture_output=True, text=True,
        timeout=900, check=False,
    )  # fmt: skip


def test_cross_built_core_loads_and_picks_neon(aarch64_tree: Path) -> None:
    code = (
        "import json, platform, kvpd.native as n; "
        "print(json.dumps([platform.machine(), n.implementation_info()]))"
    )
    done = _emulated(aarch64_tree, "-c", code)
    assert done.returncode == 0, done.stderr
    machine, info = json.loads(done.stdout)
    assert machine == "aarch64"
    assert info["implementation"] == "native", info
    assert info["isa_flags"] == "-march=armv8-a"
    assert "neon" in info["isa_features"]
    assert info["ascend_planner"] == "neon", info


def test_native_unit_tests_pass_under_emulation(aarch64_tree: Path) -> None:
    args = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", *NATIVE_TESTS]
    done = _emulated(aarch64_tree, *args)
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    # Every test ran on the native core: a skip would mean the modules did not load.
    assert "passed" in summary, summary
    assert "skipped" not in summary, done.stdout[-4000:]


def test_drop_in_equivalence_with_vllm_ascend_under_emulation(
    request: pytest.FixtureRequest,
) -> None:
    from tests.unit import upstream_equivalence as ue

    cpp, why = ue.upstream_source(dict(os.environ))
    if cpp is None:  # before the toolchain: without the source there is nothing to build
        pytest.skip(why)
    tree: Path = request.getfixturevalue("aarch64_tree")
    chain = _need_toolchain()
    out = tree / "upstream"
    out.mkdir(exist_ok=True)
    suffix, includes = chain.target.suffix(chain.python), list(chain.includes)
    ue.compile_upstream(cpp, out, str(chain.compiler), includes, ["-mcpu=tsv110"], suffix)
    done = _emulated(tree, "-m", "tests.unit.upstream_equivalence", str(out))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["mismatches"] == [], result
    assert result["chosen"] == "neon", result
    assert {"neon", "baseline"} <= set(result["isas"]), result
    assert result["runs"] == len(ue.CASES) * 2 * len(result["isas"])


def test_missing_toolchain_says_how_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    why = cross_build.find_toolchain("aarch64", sysroot=tmp_path)
    assert isinstance(why, str)
    assert "aarch64-linux-gnu-g++" in why
    assert "install-aarch64.sh" in why


def test_cross_built_wheel_runs_on_aarch64(
    tmp_path: Path, cross_wheel: tuple[Path, dict[str, object]]
) -> None:
    # The node wheel an aarch64 host gets from this controller: both extensions, tagged for
    # linux_aarch64, importable by an arm64 CPython with the NEON planner.
    import zipfile

    path, res = cross_wheel
    assert path.name == "kvpd-0.1.0-cp311-cp311-linux_aarch64.whl"
    assert res["native"] is True
    assert "cross-built on the controller" in str(res["why"])
    with zipfile.ZipFile(path) as z:
        names = z.namelist()
        z.extractall(tmp_path / "site")
    assert "kvpd/native/_ascend_planner.cpython-311-aarch64-linux-gnu.so" in names
    assert "kvpd/native/_sparse_lru.cpython-311-aarch64-linux-gnu.so" in names
    assert not any("x86_64" in n for n in names)
    code = "import json, kvpd.native as n; print(json.dumps(n.implementation_info()))"
    done = _emulated(tmp_path / "site", "-c", code)
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout)
    assert (info["implementation"], info["ascend_planner"]) == ("native", "neon"), info


def test_platform_keys_the_controller_can_cross_build() -> None:
    assert cross_build.platform_target("cpython-311-aarch64-linux-gnu") == ("aarch64", "3.11")
    assert cross_build.platform_target("cpython-312-aarch64-linux-gnu") == ("aarch64", "3.12")
    for other in ("cpython-311-x86_64-linux-gnu", "any", "pypy39-pp73-aarch64-linux-gnu", ""):
        assert cross_build.platform_target(other) is None


def test_an_aarch64_slot_gets_the_controllers_cross_built_wheel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A host slot whose Python is the emulated arm64 interpreter reports aarch64; the bundle
    # step cross-builds its wheel here (no host build), installs it with that Python's pip and
    # verifies it there: native, with the NEON planner.
    from kvpd.exec.bundle.installer import BundleInstaller
    from kvpd.exec.local import LocalTransport
    from kvpd.plan.bundle import BundleUse
    from kvpd.plan.value import HostSpec, Plan

    _need_toolchain()
    monkeypatch.setenv("KVPD_CACHE_DIR", str(tmp_path / "cache"))
    run = tmp_path / "run"
    run.mkdir()
    host = HostSpec(name="arm", address="127.0.0.1", transport="local", run_dir=str(run))
    use = BundleUse("arm", "engine", str(EMULATED), ("decode-0",), ("decode-0: planner",))
    plan = Plan("t", "0", (host,), (), (), bundle=(use,))
    t = LocalTransport(host)
    res = BundleInstaller(lambda h: t).install(plan, {"arm": str(run)})[0]
    assert res.ok, res.report
    assert (res.action, res.source) == ("installed", "cross")
    assert res.report["platform"] == "cpython-311-aarch64-linux-gnu"
    native = res.report["native"]
    assert (native["implementation"], native["ascend_planner"]) == ("native", "neon"), native
    assert native["isa_flags"] == "-march=armv8-a"
