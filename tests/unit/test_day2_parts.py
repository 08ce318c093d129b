"""Parts of the day-two verbs that need no engine: target selection, backend names, the
admin token's keeping, the `[DEPLOYMENT] [NAME ...]` grammar."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from kvpd.cli.day2_cmd import split_targets
from kvpd.errors import DeployError, StateError
from kvpd.exec import admin_token, rolling
from kvpd.plan.build import load_plan


@pytest.fixture(scope="module")
def plan():
    return load_plan("local", sets=["decode.instances=2", "hosts.localhost.devices=3"])


def test_select_names_groups_and_proxy_last(plan) -> None:
    assert [p.name for p in rolling.select(plan, ["proxy", "decode"])] == [
        "decode-0", "decode-1", "proxy"]  # fmt: skip
    assert [p.name for p in rolling.select(plan, [])][-1] == "proxy"
    with pytest.raises(DeployError, match="no process or group decode-7"):
        rolling.select(plan, ["decode-7"])


def test_backend_names_follow_the_proxy_flags(plan) -> None:
    assert rolling.proxy_backend_names(plan) == {
        "prefill-0": "prefill-0", "decode-0": "decode-0", "decode-1": "decode-1"}  # fmt: skip


def test_admin_token_private_and_masked(plan, tmp_path: Path) -> None:
    issued = admin_token.issue(plan, tmp_path)
    token = admin_token.read(tmp_path, plan.deployment)
    assert len(token) >= 32
    f = admin_token.path(tmp_path, plan.deployment)
    assert stat.S_IMODE(os.stat(f).st_mode) == 0o600
    spec = next(x for x in issued.files if x.path == "proxy/admin-token")
    assert spec.mode == 0o600
    assert spec.content.strip() == token
    assert token not in issued.to_json()  # state.json and --json mask it
    proxy = issued.process("proxy")
    assert token not in " ".join(proxy.command)
    assert "--admin-token-file" in proxy.command


def test_split_targets() -> None:
    assert split_targets(["local", "decode-0"], ["local", "other"]) == ("local", ["decode-0"])
    assert split_targets(["decode-0"], ["local"]) == ("local", ["decode-0"])
    with pytest.raises(StateError, match="name one first"):
        split_targets(["decode-0"], ["a", "b"])


def test_completion_of_deployments_and_processes(
    plan, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from types import SimpleNamespace

    from kvpd.cli import complete
    from kvpd.exec.state import DeploymentState, StateStore

    monkeypatch.setenv("KVPD_STATE_DIR", str(tmp_path))
    StateStore(tmp_path).save(DeploymentState("local", "d", plan))
    assert complete.deployments("lo") == ["local"]
    ctx = SimpleNamespace(params={"targets": []})
    assert complete.processes(ctx, "dec") == ["decode-0", "decode-1"]
    ctx = SimpleNamespace(params={"targets": ["local"]})
    assert complete.processes(ctx, "p") == ["prefill-0", "proxy"]
