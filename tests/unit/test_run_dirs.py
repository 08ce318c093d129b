"""`up` creates run dirs private and marked; `down --purge` removes only kvpd's own entries of a
dir it marked, whatever path the state file names."""

from __future__ import annotations

import stat
from pathlib import Path
from types import SimpleNamespace

import pytest

from kvpd.errors import ProfileError
from kvpd.exec import run_dirs
from kvpd.exec.local import LocalTransport
from kvpd.exec.purge import purge_run_dirs
from kvpd.plan.build import load_plan

PLAN = load_plan("local")
HOST = PLAN.hosts[0].name


def _purge(path: Path) -> dict[str, str]:
    state = SimpleNamespace(run_dirs={HOST: str(path)}, plan=PLAN)
    return purge_run_dirs(state, lambda h: LocalTransport())  # type: ignore[arg-type]


def test_purge_never_empties_a_dir_kvpd_did_not_create(tmp_path: Path) -> None:
    data = tmp_path / "data" / "models"
    (data / "logs").mkdir(parents=True)
    (data / "weights.bin").write_text("precious")
    (data / "logs" / "mine.log").write_text("precious")
    kept = _purge(data)
    assert (data / "weights.bin").exists()
    assert (data / "logs" / "mine.log").exists()
    assert "no kvpd marker" in kept[HOST]
    assert "remove it by hand" in kept[HOST]


def test_up_creates_the_run_dir_private_and_marked(tmp_path: Path) -> None:
    d = tmp_path / "opt" / "kvpd" / "run"
    run_dirs.mark(LocalTransport(), str(d), PLAN.deployment)
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    marker = d / run_dirs.MARKER
    assert stat.S_IMODE(marker.stat().st_mode) == 0o600
    assert PLAN.deployment in marker.read_text()


def test_an_existing_dir_with_content_is_not_marked(tmp_path: Path) -> None:
    (tmp_path / "x").write_text("someone's")
    run_dirs.mark(LocalTransport(), str(tmp_path), PLAN.deployment)
    assert not (tmp_path / run_dirs.MARKER).exists()


def test_purge_removes_kvpd_entries_and_keeps_the_rest(tmp_path: Path) -> None:
    d = tmp_path / "run"
    run_dirs.mark(LocalTransport(), str(d), PLAN.deployment)
    made = ("logs/a.log", "bundle/x/y", "supervise/p.json", "cache/vllm/x", "rpc/s", "tmp/t",
            "bench/r/result.json", ".launch.sh.1a2b.tmp", PLAN.files[0].path)  # fmt: skip
    for name in made:
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        (d / name).write_text("kvpd's")
    (d / "notes.txt").write_text("the operator's")
    kept = _purge(d)
    assert sorted(p.name for p in d.iterdir()) == ["notes.txt"]
    assert "notes.txt" in kept[HOST]
    (d / "notes.txt").unlink()
    run_dirs.mark(LocalTransport(), str(d), PLAN.deployment)  # empty again: ours
    (d / "logs").mkdir()
    assert _purge(d) == {}
    assert not d.exists()


def test_a_marker_of_another_deployment_is_not_ours(tmp_path: Path) -> None:
    d = tmp_path / "run"
    run_dirs.mark(LocalTransport(), str(d), "other")
    (d / "logs").mkdir()
    assert "no kvpd marker of deployment" in _purge(d)[HOST]
    assert (d / "logs").exists()


@pytest.mark.parametrize("value", ["/srv/a/../../usr/lib", "../../usr/lib", "runs/../x"])
def test_dotdot_is_refused_in_run_dir_with_its_field(value: str) -> None:
    with pytest.raises(ProfileError) as e:
        load_plan("local", sets=[f"hosts.{HOST}.run_dir={value}"])
    assert f"hosts.{HOST}.run_dir: {value!r} has a '..' component" in str(e.value)


def test_the_dirs_the_launch_scripts_make_are_kvpds_on_every_host() -> None:
    # `runtime.dirs` are made by every process's launch script (the proxy host's too), and
    # their names need not be any env variable's: purge knows them from the plan.
    plan = load_plan("local", sets=["runtime.dirs=[cache, scratch]", "env={}"])
    assert plan.made_dirs == ("cache", "scratch")
    assert {"cache", "scratch"} <= set(run_dirs.entries(plan, HOST, "/r"))
