"""The unit tests run under a private HOME (a session temporary folder), so what the local
transport writes in the login user's home (the lease, `~/.kvpd/leases`, and the deployment
index, `~/.kvpd/deployments`) never lands in the home of the user running them, nor reads what
a real `kvpd up` of that user left there. The user's `~/.ssh/config` and known hosts stay out
too (every SSH unit test names its own files).

Kept from the real home: pip's user settings (`~/.config/pip`: where the packaging tests' pip
finds packages), linked read-only in spirit, as a machine's index settings are not what a test
is about. The wheel cache is the checkout's already (tests/conftest.py). pyenv needs no home
here: its shims read PYENV_ROOT where it is set.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

REAL_HOME = Path(os.environ.get("HOME") or os.path.expanduser("~"))
KEPT = (".config/pip",)


@pytest.fixture(scope="session", autouse=True)
def private_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """HOME for the whole unit session (every kvpd process a test starts inherits it)."""
    home = tmp_path_factory.mktemp("home")
    for rel in KEPT:
        if (REAL_HOME / rel).exists():
            (home / rel).parent.mkdir(parents=True, exist_ok=True)
            (home / rel).symlink_to(REAL_HOME / rel)
    mp = pytest.MonkeyPatch()
    mp.setenv("HOME", str(home))
    yield home
    mp.undo()
