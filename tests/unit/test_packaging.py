"""kvpd as a package: the built wheel installs into a clean venv and works without the repository.

The wheel is built from the checkout (pip's isolated build, as any user's `pip install` does),
installed into a new venv with its dependencies, and run from an empty folder: `--version`,
`plan local` (the embedded default profile), `schema` and `native info`. The native core is not
compiled here (KVPD_NATIVE_BUILD=0: its build is tested by the editable install and the bundle
tests), so `native info` must report the NumPy fallback and say why.
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
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    environ.update(env)
    return subprocess.run(
        argv, cwd=cwd, env=environ, capture_output=True, text=True, timeout=900, check=False
    )


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The `kvpd` command of a fresh venv holding only the built wheel and its dependencies."""
    tmp = tmp_path_factory.mktemp("package")
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
