"""A scenario's restarted deployment gets the canary `kvpd up` ends with before any phase."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from kvpd.bench.session import Session
from kvpd.bench.settings import Scenario, make_settings
from kvpd.exec.rolling import CanaryOutcome
from tests.unit.test_rules import plan


class Service:
    """What a bench session asks of its deployments, recorded (nothing starts)."""

    def __init__(self, canary_ok: bool) -> None:
        self.canary_ok = canary_ok
        self.calls: list[str] = []

    def running(self, deployment: str) -> None:
        return None

    def stop(self, deployment: str) -> None:
        self.calls.append("stop")

    def up(self, p: Any, profile: str) -> Any:
        self.calls.append("up")
        return SimpleNamespace(plan=p)

    def transports(self, p: Any) -> Any:
        raise RuntimeError("the phases are not this test's")

    def canary(self, p: Any, run: Any) -> CanaryOutcome:
        self.calls.append("canary")
        return SimpleNamespace(ok=self.canary_ok, line="canary", problems=["decode got no KV"])


def _session(tmp_path: Path, service: Service, **kw: Any) -> Session:
    local = plan("local")
    return Session(profile="local", settings=make_settings(local.bench),
                   scenarios=[Scenario("a"), Scenario("b")], out_dir=tmp_path,
                   service=service, load=lambda sets: local, **kw)  # type: ignore[arg-type]  # fmt: skip


def test_a_failed_canary_after_a_restart_fails_that_scenario_before_any_phase(
    tmp_path: Path,
) -> None:
    service = Service(canary_ok=False)
    run = _session(tmp_path, service).run()
    assert service.calls == ["stop", "up", "canary", "stop", "up", "canary", "stop"]
    assert len(run.failures) == 2
    assert "the canary through the proxy failed" in run.failures[0]
    assert "decode got no KV" in run.failures[0]
    assert not run.records


def test_the_canary_can_be_left_out(tmp_path: Path) -> None:
    service = Service(canary_ok=False)
    with pytest.raises(RuntimeError, match="the phases"):  # straight to the first phase
        _session(tmp_path, service, prove_restarts=False).run()
    assert service.calls == ["stop", "up", "stop"]
