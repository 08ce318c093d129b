"""A unit run leaves the real `~/.kvpd` alone: a real `up` and `down` through the deployment
service and the local transport write their lease and deployment index under the session's
private HOME (tests/unit/conftest.py), and nothing of that deployment appears in the home of
the user running the tests."""

from __future__ import annotations

import os
import secrets
import shlex
import sys
from pathlib import Path

from kvpd.exec.local import LocalTransport
from kvpd.exec.service import Deployments
from kvpd.exec.state import StateStore
from kvpd.plan.value import FileSpec, HostSpec, Plan, ProcessSpec
from tests.unit.conftest import REAL_HOME

HOST = "local"


def _plan(name: str, run_dir: Path) -> Plan:
    argv = [sys.executable, "-c", "import time; time.sleep(300)"]
    return Plan(
        deployment=name,
        profile_digest="sha256:test",
        hosts=(HostSpec(HOST, "127.0.0.1", transport="local", run_dir=str(run_dir)),),
        files=(FileSpec(HOST, "sleep.sh", "exec " + shlex.join(argv) + "\n"),),
        processes=(
            ProcessSpec("sleeper", HOST, "proxy", 0, "sleep.sh", tuple(argv), log="sleep.log"),
        ),
    )


def _ours(home: Path, name: str) -> list[Path]:
    """What deployment `name` has in `home`'s .kvpd: its lease and its index entries."""
    kvpd = home / ".kvpd"
    return sorted(kvpd.glob(f"leases/{name}.json")) + sorted(kvpd.glob(f"deployments/{name}@*"))


def test_up_and_down_write_only_the_private_home(private_home: Path, tmp_path: Path) -> None:
    assert Path(os.path.expanduser("~")) == private_home != REAL_HOME
    name = f"unit-home-{secrets.token_hex(4)}"  # no other run, here or on the machine, has it
    svc = Deployments(StateStore(tmp_path / "state"), transports={HOST: LocalTransport()})
    plan = _plan(name, tmp_path / "run")
    try:
        with svc.lease(plan, "up"):  # the one `up` takes (re-entrant), held to look at it
            svc.up(plan, preflight=False)
            mine = _ours(private_home, name)
            assert [p.parent.name for p in mine] == ["leases", "deployments"], mine
            assert _ours(REAL_HOME, name) == []
        result = svc.down(name)
        assert result is not None
        assert result.clean
    finally:
        svc.close()
    assert _ours(REAL_HOME, name) == []
