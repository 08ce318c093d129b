"""Preflight on this machine through the local transport: typed requirements in, checks out
(values, rendered only by the CLI)."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

from kvpd.exec.local import LocalTransport
from kvpd.exec.preflight.run import run_checks
from kvpd.exec.service import Deployments, PreflightFailed
from kvpd.exec.state import StateStore
from kvpd.plan.value import HostRequirements, HostSpec, Interpreter, PackageNeed, Plan, PortUse


def plan(tmp_path: Path, port: int, **need: object) -> Plan:
    req = HostRequirements(
        packages=(
            PackageNeed(Interpreter(path=sys.executable), ("pytest", "kvpd-no-such-package")),
            PackageNeed(Interpreter(next_to="kvpd-no-such-command"), ("vllm",)),
        ),
        commands=("sh", "kvpd-no-such-command"),
        paths=(str(tmp_path), str(tmp_path / "missing-model")),
        **need,  # type: ignore[arg-type]
    )
    return Plan(
        deployment="pf",
        profile_digest="d",
        hosts=(HostSpec("here", "127.0.0.1", transport="local"),),
        files=(),
        processes=(),
        ports=(PortUse("here", port, "svc", "http"),),
        requirements={"here": req},
    )


def test_checks_report_each_requirement(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        checks = run_checks(plan(tmp_path, port), lambda h: LocalTransport())
    got = {c.name: c for c in checks}
    assert got["reachable"].ok
    assert got["package pytest"].ok
    assert not got["package kvpd-no-such-package"].ok
    assert f"python {sys.executable}" in got["package kvpd-no-such-package"].detail
    assert not got["python next to `kvpd-no-such-command`"].ok
    assert got["command sh"].ok
    assert not got["command kvpd-no-such-command"].ok
    assert got[f"path {tmp_path}"].ok
    assert not got[f"path {tmp_path / 'missing-model'}"].ok
    assert not got["ports free"].ok
    assert str(port) in got["ports free"].detail
    assert "memory" not in got
    assert "NPUs visible" not in got


def test_service_up_refuses_on_failed_checks_and_names_them(tmp_path: Path) -> None:
    with Deployments(StateStore(tmp_path / "s"), transports={"here": LocalTransport()}) as svc:
        with pytest.raises(PreflightFailed) as e:
            svc.up(plan(tmp_path, 1, npu=True), profile="pf")
    msg = str(e.value)
    assert "nothing was started" in msg
    assert "here: command kvpd-no-such-command: not found" in msg
    assert "NPUs visible" in msg
    assert not any(c.ok for c in e.value.checks if c.name == "NPUs visible")
    assert StateStore(tmp_path / "s").load("pf") is None
