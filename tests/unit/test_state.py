"""Deployment state: round trip, atomic writes, corrupt files, the state root."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from kvpd.errors import StateError
from kvpd.exec import state as state_mod
from kvpd.exec.state import DeploymentState, ProcessRecord, StateStore, state_root
from kvpd.plan.value import FileSpec, HealthCheck, HostSpec, Plan, ProcessSpec


def a_plan() -> Plan:
    return Plan(
        deployment="dep",
        profile_digest="sha256:abc",
        hosts=(HostSpec("h1", "10.0.0.1", user="me"),),
        files=(FileSpec("h1", "run.sh", "echo 'hi'\n", mode=0o755),),
        processes=(
            ProcessSpec(
                name="p",
                host="h1",
                role="prefill",
                stage=1,
                script="run.sh",
                command=("vllm", "serve"),
                env=(("A", "1"),),
                ports=(8000,),
                health=HealthCheck("http://10.0.0.1:8000/health"),
                devices=(0, 1),
            ),
        ),
    )


def a_state(n: int = 1) -> DeploymentState:
    st = DeploymentState(deployment="dep", profile_digest="sha256:abc", plan=a_plan())
    for i in range(n):
        st.processes.append(
            ProcessRecord(f"p{i}", "h1", 1, 100 + i, 100 + i, 5000 + i, [8000], "/x/p.log", 1.0)
        )
    return st


def test_round_trip(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    st = a_state(2)
    st.run_dirs = {"h1": "/home/me/.kvpd/run"}
    store.save(st)
    back = store.load("dep")
    assert back is not None
    assert back.plan == st.plan and back.processes == st.processes
    assert back.run_dirs == st.run_dirs and back.updated_at > 0
    assert store.deployments() == ["dep"]
    assert store.load("other") is None
    assert json.loads(store.path("dep").read_text())["format"] == 1


def test_state_root_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KVPD_STATE_DIR", str(tmp_path / "s"))
    assert state_root() == tmp_path / "s"
    assert StateStore().root == tmp_path / "s"
    monkeypatch.delenv("KVPD_STATE_DIR")
    monkeypatch.chdir(tmp_path)
    assert state_root() == tmp_path / ".kvpd"


def test_concurrent_saves_never_show_a_torn_file(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    store.save(a_state(1))
    stop = threading.Event()
    seen: list[int] = []
    errors: list[Exception] = []

    def reader() -> None:
        while not stop.is_set():
            try:
                st = store.load("dep")
                assert st is not None
                seen.append(len(st.processes))
            except Exception as e:  # noqa: BLE001
                errors.append(e)

    th = threading.Thread(target=reader)
    th.start()
    try:
        for n in range(1, 60):
            store.save(a_state(n % 7 + 1))
    finally:
        stop.set()
        th.join()
    assert not errors and seen
    assert [p.name for p in (tmp_path / "dep").iterdir()] == ["state.json"]


def test_crash_during_write_keeps_old_state(tmp_path: Path, monkeypatch) -> None:
    store = StateStore(tmp_path)
    store.save(a_state(1))

    def failing_replace(src: str, dst: str) -> None:  # fault injection: crash before rename
        raise OSError("disk gone")

    monkeypatch.setattr(state_mod.os, "replace", failing_replace)
    with pytest.raises(OSError):
        store.save(a_state(3))
    monkeypatch.setattr(state_mod.os, "replace", os.replace)
    assert len(store.load("dep").processes) == 1  # type: ignore[union-attr]
    assert [p.name for p in (tmp_path / "dep").iterdir()] == ["state.json"]


def test_corrupt_state_is_a_clear_error(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    store.path("dep").parent.mkdir(parents=True)
    store.path("dep").write_text("{not json")
    with pytest.raises(StateError, match=r"state\.json: state file is corrupt"):
        store.load("dep")
