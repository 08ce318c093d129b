"""`kvpd up/status/logs/down` through the real CLI app, on local test services."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import kvpd.cli.deploy_cmd as deploy_cmd
from kvpd.cli import target
from kvpd.cli.main import build_app
from kvpd.errors import StateError
from kvpd.exec.local import LocalTransport
from kvpd.exec.state import StateStore
from tests.unit.test_executor import make_plan


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("KVPD_STATE_DIR", str(tmp_path / "state"))
    plan = make_plan(tmp_path / "run", [("kv", 0, "ok"), ("proxy", 1, "ok")], deployment="demo")
    # Stand-in for the profile -> plan step (tested on its own): the test's plan.
    monkeypatch.setattr(deploy_cmd, "_load_plan", lambda profile, **kw: plan)
    # ... and for the verbs that build it again (from PROFILE or from the cache's recipe)
    monkeypatch.setattr(target, "build", lambda profile, **kw: plan)
    runner = CliRunner()
    app = build_app()

    def run(*args: str):
        return runner.invoke(app, list(args))

    yield run
    store = StateStore(tmp_path / "state")
    st = store.load("demo")
    if st is not None:  # never leave processes behind
        t = LocalTransport()
        for r in st.processes:
            if t.alive(r.pid, start_ticks=r.start_ticks):
                t.signal_group(r.pgid, 9, start_ticks=r.start_ticks)


def test_up_status_logs_down_json(cli) -> None:
    r = cli("up", "demo.yaml", "--yes", "--json")
    assert r.exit_code == 0, r.output
    up = json.loads(r.stdout)
    assert up["status"] == "up"
    assert [p["name"] for p in up["processes"]] == ["kv", "proxy"]

    r = cli("status", "--json")
    assert r.exit_code == 0, r.output
    st = json.loads(r.stdout)
    assert all(
        p["alive"] and p["healthy"] and p["listening"] == p["ports"] for p in st["processes"]
    )

    r = cli("logs", "proxy", "-n", "5")
    assert r.exit_code == 0
    assert "proxy listening on" in r.stdout

    r = cli("up", "demo.yaml", "--yes")
    assert isinstance(r.exception, StateError)
    assert "kvpd down demo.yaml" in str(r.exception)

    r = cli("down", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["clean"]
    assert [p["result"] for p in d["processes"]] == ["stopped", "stopped"]
    assert [p["name"] for p in d["processes"]] == ["proxy", "kv"]

    r = cli("down", "demo")  # the hosts' records are gone with the processes
    assert r.exit_code == 0
    assert "no host records a process of 'demo'" in r.stdout

    r = cli("status", "--json")
    assert not any(p["alive"] for p in json.loads(r.stdout)["processes"])


def test_up_needs_yes_when_not_interactive(cli) -> None:
    r = cli("up", "demo.yaml")
    assert r.exit_code == 2
    assert "--yes" in r.output


def test_down_without_state(cli) -> None:
    """A name alone says nothing about where the hosts are: the profile does."""
    r = cli("down", "--deployment", "nope")
    assert r.exit_code == 1
    assert "give its profile" in str(r.exception)
    r = cli("down", "demo.yaml")  # a profile: its hosts are asked, and hold no record
    assert r.exit_code == 0
    assert "Nothing to stop: no host records a process of 'demo'" in r.stdout


def test_one_grammar_logs_and_events(cli) -> None:
    """`kvpd logs DEPLOYMENT PROCESS` and `kvpd status DEPLOYMENT --events`."""
    assert cli("up", "demo.yaml", "--yes", "--json").exit_code == 0
    r = cli("logs", "demo", "proxy", "-n", "5")
    assert r.exit_code == 0
    assert "proxy listening on" in r.stdout
    r = cli("logs", "demo", "nope")
    assert "has no process 'nope'" in str(r.exception)
    assert cli("down", "demo").exit_code == 0
    r = cli("status", "demo", "--events", "--json")
    assert r.exit_code == 0, r.output
    assert [e["what"] for e in json.loads(r.stdout)["events"]] == ["up", "down"]


def test_diagnose_a_deployment_with_a_dead_process(cli, tmp_path: Path) -> None:
    import tarfile

    assert cli("up", "demo.yaml", "--yes", "--json").exit_code == 0
    st = StateStore(tmp_path / "state").load("demo")
    kv = st.record("kv")
    LocalTransport().signal_group(kv.pgid, 9, start_ticks=kv.start_ticks)
    r = cli("diagnose", "demo")
    assert r.exit_code == 0, r.output
    assert "exited" in r.stdout
    assert "healthy" in r.stdout
    archive = Path(r.stdout.split("Archive:", 1)[1].split()[0])
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        summary = tar.extractfile(next(n for n in names if n.endswith("summary.txt"))).read()
    assert b"kv on local: exited" in summary
    assert b"proxy on local: healthy" in summary
    assert any(n.endswith("hosts/local/facts.txt") for n in names)
    assert cli("down", "demo").exit_code == 0


def test_failed_canary_stops_the_deployment_unless_kept(cli, monkeypatch) -> None:
    """The verdict is stubbed (engines cannot run here); what `up` does with it is real."""
    from kvpd.bench import canary

    problem = "canary: decode received no KV: vllm:prompt_tokens_by_source_total{...} did not grow"
    failed = canary.CanaryResult(False, "canary FAILED: " + problem, [problem])
    monkeypatch.setattr(canary, "applies", lambda plan: True)
    asked: list[bool] = []

    def run(
        plan: object, transports: object, *, verify_outputs: bool = True
    ) -> canary.CanaryResult:
        asked.append(verify_outputs)
        return failed

    monkeypatch.setattr(canary, "run", run)
    r = cli("up", "demo.yaml", "--yes")
    assert r.exit_code == 1
    assert asked == [True]
    msg = str(r.exception)
    assert "the canary through the proxy failed" in msg
    assert "prompt_tokens_by_source" in msg
    assert "The deployment was stopped" in msg
    st = json.loads(cli("status", "demo", "--json").stdout)
    assert not any(p["alive"] for p in st["processes"])

    r = cli("up", "demo.yaml", "--yes", "--keep-on-failure", "--no-verify-outputs")
    assert r.exit_code == 1
    assert "left up (--keep-on-failure)" in str(r.exception)
    assert asked == [True, False]
    st = json.loads(cli("status", "demo", "--json").stdout)
    assert all(p["alive"] for p in st["processes"])
    events = json.loads(cli("status", "demo", "--events", "--json").stdout)["events"]
    assert [e["what"] for e in events] == ["up", "canary", "down", "up", "canary"]
    assert cli("down", "demo").exit_code == 0
