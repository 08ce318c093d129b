"""Shared pytest options: `--update-golden` rewrites the golden files from the current output.

The skip policy. A test skips when this machine lacks what it needs (root for the SSH bed's
namespaces, a C++ compiler, qemu and the arm64 Python, the CPU engine and model, the services
venv, OpenSSH's sftp-server, a dev dependency), saying what is missing and how to get it: a
developer's non-root run stays useful. Under `CI=true` every such skip is a failure with the same
words, so a green CI run means every test ran. The skips that are not about the environment
(a parametrisation that does not apply, a transport that lacks the feature under test) are listed
in DELIBERATE_SKIPS with the reason they stay skips; any other skip reason counts as an
environment skip, so a new one fails CI until it is classified.

The suite keeps kvpd's wheel cache inside the checkout (`.kvpd/cache`, unless KVPD_CACHE_DIR is
set): a run neither reads what an earlier run or another checkout left in `~/.cache/kvpd` nor
leaves wheels there. Set here, at import, so every kvpd process the tests start inherits it.
"""

from __future__ import annotations

import os
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

from kvpd.testing.termination import stop_on_termination
from tests.unit.upstream_equivalence import NO_SOURCE

# The SSH test bed's session fixture, one for the e2e tests and the unit transport contract.
pytest_plugins = ("tests.testbed",)

# Skip reasons that hold on every machine, CI included (compared with the skip's message).
DELIBERATE_SKIPS: dict[str, str] = {
    # test_proxy_security: the (flow, prefill_params) grid has cells that do not exist
    "only prefill-first reads the prefill's kv_transfer_params": "no such combination",
    # test_transport_contract runs every transport; the scripted fake models neither
    "the fake has no permissions": "the fake transport has no file modes",
    "the fake runs no shell": "the fake transport runs no shell",
    # test_ascend_planner_upstream / test_native_aarch64: vLLM-Ascend's planner source is on
    # GitHub, which CI cannot reach and no package on the registry carries; the user fetches it
    NO_SOURCE: "vLLM-Ascend's planner source is the user's to fetch",
}
CI_SKIP_FAILS = "CI=true: this test was skipped for a missing environment, which CI must provide"

# SIGTERM (a CI runner's or `timeout`'s stop) runs the fixture teardowns, as Ctrl-C does: the
# engines, proxies and bed hosts the suite started are stopped, not left running.
stop_on_termination()

os.environ.setdefault(
    "KVPD_CACHE_DIR", str(Path(__file__).resolve().parent.parent / ".kvpd" / "cache")
)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden",
        action="store_true",
        default=False,
        help="rewrite tests/golden/* from the current rendering (review the diff!)",
    )


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-golden"))


def _skip_reason(report: pytest.CollectReport | pytest.TestReport) -> str:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return reason.removeprefix("Skipped: ")


def deliberate_skip(reason: str) -> bool:
    return reason in DELIBERATE_SKIPS


def _fail_in_ci(report: pytest.CollectReport | pytest.TestReport) -> None:
    """Under CI=true, turn an environment skip into a failure that says what is missing."""
    if os.environ.get("CI") != "true" or not report.skipped or hasattr(report, "wasxfail"):
        return
    reason = _skip_reason(report)
    if not deliberate_skip(reason):
        report.outcome = "failed"
        report.longrepr = f"{CI_SKIP_FAILS}: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    outcome = yield
    _fail_in_ci(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Generator[None, Any, None]:
    """A module skipped at import (`pytest.importorskip`) is judged the same way."""
    outcome = yield
    _fail_in_ci(outcome.get_result())
