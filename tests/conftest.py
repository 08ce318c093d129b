"""Shared pytest options: `--update-golden` rewrites the golden files from the current output.

The suite keeps kvpd's wheel cache inside the checkout (`.kvpd/cache`, unless KVPD_CACHE_DIR is
set): a run neither reads what an earlier run or another checkout left in `~/.cache/kvpd` nor
leaves wheels there. Set here, at import, so every kvpd process the tests start inherits it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvpd.testing.termination import stop_on_termination

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
