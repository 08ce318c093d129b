"""Fixtures shared by the end-to-end tests."""

from __future__ import annotations

import pytest

from tests.e2e.local_deploy import _local_deployment, local_deployment  # noqa: F401  (fixtures)
from tests.testbed import (
    Testbed,
    engine_or_services_missing,
    not_root,
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests that break the shared local deployment on purpose (marked
    `breaks_local_deployment`) run right after the last other test that uses it, so those need
    no new `up` of it (two CPU engines and the proxy, minutes on 2 shared cores). Any order
    still passes: the `local_deployment` fixture starts it again when a test left it broken."""
    breakers = [i for i in items if i.get_closest_marker("breaks_local_deployment")]
    if not breakers:
        return
    rest = [i for i in items if i not in breakers]
    users = [n for n, i in enumerate(rest) if "local_deployment" in getattr(i, "fixturenames", ())]
    at = users[-1] + 1 if users else len(rest)
    items[:] = rest[:at] + breakers + rest[at:]


@pytest.fixture(scope="module")
def bed(request: pytest.FixtureRequest) -> Testbed:
    """The session's test bed, once what every SSH end-to-end module needs is known to be there:
    root (namespaces, mounts), the CPU engine, the tiny model and the services venv (`make test`
    installs them all). One definition: a module-level copy per test file trips ruff's F811
    when imported, so they were copied; conftest fixtures need no import."""
    why = not_root() or engine_or_services_missing()
    if why:
        pytest.skip(why)
    return request.getfixturevalue("testbed")  # type: ignore[no-any-return]
