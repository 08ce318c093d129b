"""kvpd as a package: it installs two ways a user would and works without the repository.

- `pip install` of the built wheel: the wheel is built from the checkout (pip's isolated build,
  as any user's `pip install` does) and installed into a new venv with its dependencies;
- `pipx install` of the checkout: pipx (a dev dependency) builds it and makes its own venv,
  with PIPX_HOME and PIPX_BIN_DIR in a temporary folder, so nothing of the user's pipx changes.

Each install's `kvpd` is run from an empty folder: `--version`, `plan local` (the embedded
default profile), `schema` and `native info`. The native core is not compiled here
(KVPD_NATIVE_BUILD=0: its build is tested by the editable install and the bundle tests), so
`native info` must report the NumPy fallback. Each install is made once per module (about 20 s
each on 2 cores) and shared by the four checks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

import kvpd

REPO = Path(__file__).resolve().parents[2]


def _run(argv: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTHON", "VIRTUAL_ENV", "PIPX_", "KVPD_STATE_DIR"))
    }
    environ.update(env)
    return subprocess.run(
        argv, cwd=cwd, env=environ, capture_output=True, text=True, timeout=900, check=False
    )


def _wheel_install(tmp: Path) -> Path:
    """The `kvpd` command of a fresh venv holding only the built wheel and its dependencies."""
    dist = tmp / "dist"
    argv = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(REPO)]
    built = _run(argv, cwd=tmp, KVPD_NATIVE_BUILD="0")
    assert built.returncode == 0, built.stderr[-3000:]
    wheels = list(dist.glob(f"kvpd-{kvpd.__version__}-*.whl"))
    assert len(wheels) == 1, list(dist.iterdir())
    venv.create(tmp / "venv", with_pip=True)
    pip = tmp / "venv" / "bin" / "pip"
    inst = _run([str(pip), "install", "-q", "--disable-pip-version-check", str(wheels[0])], tmp)
    assert inst.returncode == 0, inst.stderr[-3000:]
    return tmp / "venv" / "bin" / "kvpd"


def _pipx_install(tmp: Path) -> Path:
    """The `kvpd` command `pipx install CHECKOUT` puts in PIPX_BIN_DIR (all of pipx's state in
    `tmp`: the user's own pipx installs are neither read nor changed)."""
    pipx = Path(sys.executable).with_name("pipx")
    if not pipx.exists():
        pytest.fail("pipx is missing from the dev environment (pip install -e '.[dev]')")
    dirs = {"PIPX_HOME": tmp / "home", "PIPX_BIN_DIR": tmp / "bin", "PIPX_MAN_DIR": tmp / "man"}
    env = {k: str(v) for k, v in dirs.items()}
    r = _run([str(pipx), "install", str(REPO)], tmp, KVPD_NATIVE_BUILD="0", **env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return tmp / "bin" / "kvpd"


INSTALLS = {"pip-wheel": _wheel_install, "pipx-checkout": _pipx_install}


@pytest.fixture(scope="module", params=sorted(INSTALLS))
def installed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The `kvpd` command of one install, made once for the module."""
    return INSTALLS[request.param](tmp_path_factory.mktemp(request.param))


@pytest.fixture
def empty(tmp_path: Path) -> Path:
    d = tmp_path / "empty"
    d.mkdir()
    return d


def test_version_is_the_packages(installed: Path, empty: Path) -> None:
    r = _run([str(installed), "--version"], empty)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"kvpd {kvpd.__version__}"


def test_plan_of_the_embedded_default_works_outside_the_repository(
    installed: Path, empty: Path
) -> None:
    r = _run([str(installed), "plan", "local", "--json"], empty)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    plan = json.loads(r.stdout)
    assert {p["role"] for p in plan["processes"]} >= {"prefill", "decode", "proxy"}


def test_schema_carries_descriptions(installed: Path, empty: Path) -> None:
    r = _run([str(installed), "schema"], empty)
    assert r.returncode == 0, r.stderr
    assert "description" in json.loads(r.stdout).get("properties", {}).get("hosts", {})


def test_native_info_reports_the_fallback(installed: Path, empty: Path) -> None:
    r = _run([str(installed), "native", "info"], empty)
    assert r.returncode == 0, r.stderr
    assert "numpy" in r.stdout
    assert "why NumPy" in r.stdout, r.stdout
    assert "To build the native core" in r.stdout, r.stdout
