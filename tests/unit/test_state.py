"""Deployment state: round trip, atomic writes, corrupt files, the state root."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from kvpd.errors import StateError
from kvpd.exec import state as state_mod
from kvpd.exec.bundle.result import BundleSlot, SlotResult
from kvpd.exec.state import DeploymentState, ProcessRecord, StateStore, state_root
from kvpd.plan.value import FileSpec, HealthCheck, HostSpec, Plan, ProcessSpec


def _spec(name: str) -> ProcessSpec:
    return ProcessSpec(
        name=name,
        host="h1",
        role="prefill",
        stage=1,
        script="run.sh",
        command=("vllm", "serve"),
        env=(("A", "1"),),
        ports=(8000,),
        health=HealthCheck("http://10.0.0.1:8000/health"),
        devices=(0, 1),
    )


def a_plan(n: int = 1) -> Plan:
    return Plan(
        deployment="dep",
        profile_digest="sha256:abc",
        hosts=(HostSpec("h1", "10.0.0.1", user="me"),),
        files=(FileSpec("h1", "run.sh", "echo 'hi'\n", mode=0o755),),
        processes=tuple(_spec(f"p{i}") for i in range(n)),
    )


RUN = "/home/me/.kvpd/run"


def a_state(n: int = 1) -> DeploymentState:
    st = DeploymentState(
        deployment="dep", profile_digest="sha256:abc", plan=a_plan(n), run_dirs={"h1": RUN}
    )
    for i in range(n):
        log = f"{RUN}/logs/p{i}.log"
        st.processes.append(
            ProcessRecord(f"p{i}", "h1", 1, 100 + i, 100 + i, 5000 + i, [8000], log, 1.0)
        )
    return st


def test_round_trip(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    st = a_state(2)
    store.save(st)
    back = store.load("dep")
    assert back is not None
    assert back.plan == st.plan
    assert back.processes == st.processes
    assert back.run_dirs == st.run_dirs
    assert back.updated_at > 0
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
    assert not errors
    assert seen
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


def _tampered(tmp_path: Path, edit) -> str:
    store = StateStore(tmp_path)
    store.save(a_state(1))
    p = store.path("dep")
    d = json.loads(p.read_text())
    edit(d)
    p.write_text(json.dumps(d))
    with pytest.raises(StateError) as e:
        store.load("dep")
    return str(e.value)


def _rec(field: str, value: object):
    return lambda d: d["processes"][0].__setitem__(field, value)


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (_rec("pid", 1), "processes['p0'].pid: 1 is not a process number"),
        (_rec("pgid", -1), "processes['p0'].pgid: -1 is not a process number"),
        (_rec("pgid", 4242), "differs from pid 100"),
        (_rec("pid", "100; rm -rf /"), "processes['p0'].pid: '100; rm -rf /'"),
        (_rec("host", "evil"), "processes['p0'].host: 'evil', but the plan runs it on 'h1'"),
        (_rec("name", "stranger"), "processes['stranger']: no process of that name"),
        (_rec("log", "/etc/passwd"), "processes['p0'].log: '/etc/passwd' is not its planned log"),
        (_rec("ports", [22]), "processes['p0'].ports: [22] are not the planned ports"),
        (_rec("status", "zombie"), "processes['p0'].status: 'zombie' is not one of running"),
        (
            lambda d: d["run_dirs"].update(h1="/usr/lib"),
            "run_dirs['h1']: '/usr/lib' is not the plan's run dir '.kvpd/run'",
        ),
        (lambda d: d["run_dirs"].update(h1="/srv/a/../../usr"), "without '..'"),
        (lambda d: d["run_dirs"].update(evil="/srv/x"), "run_dirs['evil']: not a host of the plan"),
        (lambda d: d["plan"].update(proxy_url="http://203.0.113.9:80"), "plan.proxy_url"),
        (lambda d: d.update(deployment="other"), "deployment: 'other' is not the deployment"),
        (
            lambda d: d["plan"]["hosts"][0].update(
                container={"runtime": "docker", "command": "docker", "name": "-v=/:/host"}
            ),
            "plan.hosts['h1'].container: 'docker' '-v=/:/host' is not a runtime",
        ),
    ],
)
def test_every_loaded_field_is_checked(tmp_path: Path, edit, says: str) -> None:
    msg = _tampered(tmp_path, edit)
    assert says in msg
    assert "kvpd will not act on it" in msg
    assert "Fix:" in msg


@pytest.mark.parametrize("which", ["root", "deployment dir", "file"])
def test_a_state_others_may_write_is_refused(tmp_path: Path, which: str) -> None:
    store = StateStore(tmp_path / "state")
    store.save(a_state(1))
    path = {"root": store.root, "deployment dir": store.path("dep").parent}.get(
        which, store.path("dep")
    )
    path.chmod(path.stat().st_mode | 0o002)
    with pytest.raises(StateError) as e:
        store.load("dep")
    assert f"{path}: the state {which}" in str(e.value) or f"{path}: the {which}" in str(e.value)
    assert "writable by group or others" in str(e.value)
    assert "chmod go-w" in str(e.value)


def test_a_state_file_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    store.save(a_state(1))
    real = tmp_path / "elsewhere.json"
    store.path("dep").rename(real)
    store.path("dep").symlink_to(real)
    with pytest.raises(StateError, match="is a symbolic link"):
        store.load("dep")


def test_the_state_dir_is_created_private(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "new" / "root")
    store.save(a_state(1))
    for p in (store.root, store.path("dep").parent):
        assert p.stat().st_mode & 0o077 == 0
    assert store.path("dep").stat().st_mode & 0o077 == 0


DIGEST = "ab" * 32


def a_bundle_slot() -> BundleSlot:
    """A slot as the bundle step records it, from a host's (vetted) report."""
    report = {
        "slot": "engine",
        "ready": True,
        "executable": "/usr/bin/python3",
        "version": "3.11.2",
        "platform": "cpython-311-x86_64-linux-gnu",
        "pip": True,
        "compiler": True,
        "digest": DIGEST,
        "folder": f"{RUN}/bundle/{DIGEST[:16]}",
        "native": {"implementation": "native", "isa_flags": "-mavx2", "openmp": 201511},
    }
    return SlotResult("h1", "engine", "@vllm", report, "installed", "local", 1.23456).recorded()


def test_the_bundle_is_recorded_as_before_and_loads_back(tmp_path: Path) -> None:
    """state.json keeps the bundle rows' JSON (fields, order, values) and loads them back as
    the typed slot."""
    store = StateStore(tmp_path)
    st = a_state(1)
    st.bundle = [a_bundle_slot()]
    store.save(st)
    row = json.loads(store.path("dep").read_text())["bundle"][0]
    assert list(row) == ["host", "slot", "python", "executable", "version", "platform",
                         "digest", "folder", "implementation", "compiler", "native", "action",
                         "source", "seconds", "problem"]  # fmt: skip
    assert row["implementation"] == "native"
    assert row["seconds"] == 1.235
    assert row["problem"] == ""
    back = store.load("dep")
    assert back is not None
    assert back.bundle == st.bundle
    assert back.bundle[0].native["isa_flags"] == "-mavx2"


def test_a_bundle_row_of_an_older_kvpd_loads_with_defaults(tmp_path: Path) -> None:
    def older(d: dict[str, Any]) -> None:
        for k in ("compiler", "source"):
            del d["bundle"][0][k]

    st = a_state(1)
    st.bundle = [a_bundle_slot()]
    store = StateStore(tmp_path)
    store.save(st)
    p = store.path("dep")
    d = json.loads(p.read_text())
    older(d)
    p.write_text(json.dumps(d))
    back = store.load("dep")
    assert back is not None
    assert back.bundle[0].compiler is None
    assert back.bundle[0].source == ""


def _slot(field: str, value: object):
    def edit(d: dict[str, Any]) -> None:
        d["bundle"] = [a_bundle_slot().to_json()]
        d["bundle"][0][field] = value

    return edit


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (_slot("slot", "kernel"), "bundle[0].slot: 'kernel' is not one of engine, proxy"),
        (_slot("digest", "abc"), "bundle[0].digest: 'abc' is not a sha256"),
        (_slot("platform", "any"), "bundle[0].platform: 'any' is not a Python platform key"),
        (_slot("action", "deleted"), "bundle[0].action: 'deleted' is not one of kept"),
        (_slot("source", "host:a b"), "bundle[0].source: 'host:a b' is not where a wheel"),
        (_slot("implementation", "asm"), "bundle[0].implementation: 'asm' is not one of"),
        (_slot("compiler", "yes"), "bundle[0].compiler: 'yes' is not true, false or null"),
        (_slot("native", {"isa": ["x"]}), "bundle[0].native: {'isa': ['x']} is not an object"),
        (_slot("seconds", -1), "bundle[0].seconds: -1 is not a number of seconds"),
        (_slot("host", 7), "bundle[0].host: 7 is not a host name"),
        (_slot("shell", "rm -rf /"), "bundle[0]: unknown field 'shell'"),
        (lambda d: d.update(bundle=[{"host": "h1"}]), "bundle[0]: missing field 'slot'"),
        (lambda d: d.update(bundle={"h1": {}}), "bundle: {'h1': {}} is not a list"),
        (lambda d: d.update(bundle=["h1"]), "bundle[0]: 'h1' is not an object"),
    ],
)
def test_every_bundle_field_is_checked(tmp_path: Path, edit, says: str) -> None:
    msg = _tampered(tmp_path, edit)
    assert "state file is corrupt" in msg, msg
    assert says in msg, msg


def test_a_host_reported_value_that_would_not_load_is_not_recorded() -> None:
    """The native info is the host's word: only plain values are recorded, and an
    implementation kvpd does not know is none, so what `up` writes always loads."""
    r = SlotResult("h1", "engine", "@vllm", {"ready": True, "native": {
        "implementation": "asm", "nested": {"a": 1}, "reason": None}})  # fmt: skip
    slot = r.recorded()
    assert slot.implementation is None
    assert dict(slot.native) == {
        "implementation": "asm",
        "reason": None,
    }
    assert BundleSlot.from_json(slot.to_json()) == slot


@pytest.mark.parametrize(
    "edit",
    [
        _rec("role", "wizard"),
        lambda d: d["plan"]["processes"][0].update(role="wizard"),
    ],
)
def test_a_role_that_is_not_one_is_refused(tmp_path: Path, edit) -> None:
    msg = _tampered(tmp_path, edit)
    assert "state file is corrupt" in msg, msg
    assert "'wizard' is not a valid Role" in msg, msg
