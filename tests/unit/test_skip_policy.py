"""The skip policy of tests/conftest.py: under CI=true an environment skip fails, saying what is
missing; a developer's run skips with the reason; the listed deliberate skips stay skips.

A small suite is run by a real pytest in a temporary folder with the policy's hooks as its
conftest, once with CI=true and once without.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import CI_SKIP_FAILS, DELIBERATE_SKIPS

REPO = Path(__file__).resolve().parents[2]
DELIBERATE = next(iter(DELIBERATE_SKIPS))

SUITE = f"""
import pytest

def test_needs_root():
    pytest.skip("needs root for the bed's namespaces")

@pytest.mark.skipif(True, reason="qemu-aarch64-static is missing")
def test_needs_qemu():
    pass

def test_not_applicable():
    pytest.skip({DELIBERATE!r})

@pytest.fixture(scope="module")
def engine():
    pytest.skip("CPU engine venv not installed (run `make engine`)")

def test_uses_the_engine(engine):
    pass

def test_runs():
    pass
"""
IMPORT_SKIP = 'import pytest\npytest.importorskip("kvpd_no_such_module", reason="no such module")\n'
CONFTEST = "from tests.conftest import pytest_make_collect_report, pytest_runtest_makereport\n"


def _run_suite(tmp_path: Path, ci: bool, suite: str = SUITE) -> subprocess.CompletedProcess[str]:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_suite.py").write_text(suite)
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTEST_ADDOPTS")}
    env["PYTHONPATH"] = str(REPO)
    if ci:
        env["CI"] = "true"
    argv = [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", str(tmp_path)]
    return subprocess.run(
        argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False
    )


def test_a_developer_run_skips_and_says_why(tmp_path: Path) -> None:
    r = _run_suite(tmp_path, ci=False)
    assert r.returncode == 0, r.stdout
    assert "1 passed, 4 skipped" in r.stdout, r.stdout
    assert "needs root for the bed's namespaces" in r.stdout


def test_ci_fails_every_environment_skip_saying_what_is_missing(tmp_path: Path) -> None:
    r = _run_suite(tmp_path, ci=True)
    assert r.returncode == 1, r.stdout
    assert "1 passed, 1 skipped" in r.stdout, r.stdout
    for missing in (
        "needs root for the bed's namespaces",
        "qemu-aarch64-static is missing",
        "CPU engine venv not installed (run `make engine`)",
    ):
        assert f"{CI_SKIP_FAILS}: {missing}" in r.stdout, (missing, r.stdout)


def test_ci_keeps_the_deliberate_skips(tmp_path: Path) -> None:
    r = _run_suite(tmp_path, ci=True)
    skipped = [line for line in r.stdout.splitlines() if line.startswith("SKIPPED [1] test_suite")]
    assert len(skipped) == 1, r.stdout
    assert skipped[0].endswith(f": {DELIBERATE}"), r.stdout


@pytest.mark.parametrize("ci", [False, True], ids=["developer", "ci"])
def test_a_module_skipped_at_import_fails_only_in_ci(tmp_path: Path, ci: bool) -> None:
    r = _run_suite(tmp_path, ci=ci, suite=IMPORT_SKIP)
    if ci:
        assert r.returncode != 0, r.stdout
        assert f"{CI_SKIP_FAILS}: no such module" in r.stdout, r.stdout
    else:
        assert "1 skipped" in r.stdout, r.stdout
        assert CI_SKIP_FAILS not in r.stdout, r.stdout
