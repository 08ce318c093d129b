"""The node-side supervisor, run for real as `python -m kvpd.supervisor` on small commands."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvpd.errors import ProfileError
from kvpd.plan.build import load_plan

REPO = Path(__file__).resolve().parents[2]


def _start(tmp_path: Path, *args: str) -> tuple[subprocess.Popen, Path]:
    status = tmp_path / "supervise" / "p.json"
    cmd = [sys.executable, "-m", "kvpd.supervisor", "--status", str(status), "--name", "p", *args]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    log = open(tmp_path / "p.log", "ab")  # the child's log, closed by the OS
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=log, start_new_session=True), status


def _wait(pred, timeout: float = 20.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError("timed out")


def _status(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return {}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_keeps_failing_then_gives_up(tmp_path: Path) -> None:
    sup, status = _start(tmp_path, "--max-restarts", "2", "--backoff", "0.05", "--",
                         "sh", "-c", "echo boom >&2; exit 3")  # fmt: skip
    assert sup.wait(timeout=30) == 3
    st = _status(status)
    assert st["state"] == "failed"
    assert st["restarts"] == 2
    assert len(st["starts"]) == 3
    assert st["last_exit"]["code"] == 3
    assert "2 restarts within" in st["gave_up"]
    log = (tmp_path / "p.log").read_text()
    assert log.count("boom") == 3
    assert "giving up" in log


def test_sigkilled_child_restarted_and_stop_takes_child(tmp_path: Path) -> None:
    sup, status = _start(tmp_path, "--backoff", "0", "--grace", "2", "--", "sleep", "60")
    try:
        first = _wait(lambda: _status(status).get("child_pid"))
        assert os.getpgid(first) == first != os.getpgid(sup.pid)  # own process group
        os.kill(first, signal.SIGKILL)
        st = _wait(lambda: (s := _status(status)).get("restarts") == 1
                   and s["state"] == "running" and s)  # fmt: skip
        assert st["last_exit"]["signal"] == "SIGKILL"
        assert st["child_pid"] != first
        second = st["child_pid"]
        os.kill(sup.pid, signal.SIGTERM)
        assert sup.wait(timeout=10) == 0
        assert not _alive(second)
        assert _status(status)["state"] == "stopped"
    finally:
        if sup.poll() is None:
            os.killpg(sup.pid, signal.SIGKILL)


def test_supervisor_killed_takes_child_with_it(tmp_path: Path) -> None:
    sup, status = _start(tmp_path, "--", "sleep", "60")
    child = _wait(lambda: _status(status).get("child_pid"))
    os.kill(sup.pid, signal.SIGKILL)
    sup.wait(timeout=10)
    _wait(lambda: not _alive(child), timeout=10)


def test_never_and_clean_exit_do_not_restart(tmp_path: Path) -> None:
    sup, status = _start(tmp_path, "--restart", "never", "--", "sh", "-c", "exit 5")
    assert sup.wait(timeout=20) == 5
    assert _status(status)["restarts"] == 0
    sup, status = _start(tmp_path, "--", "true")
    assert sup.wait(timeout=20) == 0
    assert _status(status)["state"] == "exited"


def test_restart_policy_renders_supervised_launch_script() -> None:
    plan = load_plan("local", sets=["decode.restart.policy=on-failure",
                                    "decode.restart.max_restarts=2"])  # fmt: skip
    script = next(f.content for f in plan.files if f.path == "decode-0/launch.sh")
    assert "exec python3 -m kvpd.supervisor --status supervise/decode-0.json" in script
    assert "--max-restarts 2" in script
    assert "-- \\\n    vllm serve" in script
    assert "--ready-url http://127.0.0.1:18200/health" in script
    prefill = next(f.content for f in plan.files if f.path == "prefill-0/launch.sh")
    assert "kvpd.supervisor" not in prefill  # default: never


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("decode.restart.policy=always", "decode.restart.policy"),
        ("decode.restart.max_restarts=0", "decode.restart.max_restarts"),
        ("proxy.restart.window_s=-1", "proxy.restart.window_s"),
        ("decode.restart.backof_s=1", "backof_s"),
    ],
)
def test_bad_restart_policy_is_located(override: str, needle: str) -> None:
    with pytest.raises(ProfileError) as e:
        load_plan("local", sets=[override])
    assert needle in str(e.value)


def test_exit_before_ever_ready_is_not_restarted(tmp_path: Path) -> None:
    """`up` must see a process that cannot start at once, not after restarts."""
    sup, status = _start(tmp_path, "--ready-url", "http://127.0.0.1:9/health",
                         "--", "sh", "-c", "exit 4")  # fmt: skip
    assert sup.wait(timeout=20) == 4
    st = _status(status)
    assert st["restarts"] == 0
    assert st["gave_up"] == "exited before it was ever ready"


def test_status_records_the_childs_start_time_for_the_reuse_guard(tmp_path: Path) -> None:
    sup, status = _start(tmp_path, "--", "sleep", "60")
    try:
        st = _wait(lambda: (s := _status(status)).get("child_pid") and s)
        child = st["child_pid"]
        ticks = int(Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[19])
        assert st["child_start_ticks"] == ticks > 0
        assert os.getsid(child) == child == st["child_pgid"]  # the session the guard checks
    finally:
        os.kill(sup.pid, signal.SIGTERM)
        sup.wait(timeout=10)


def test_what_the_child_leaves_in_its_group_is_killed_before_it_is_reaped(
    tmp_path: Path,
) -> None:
    pidfile = tmp_path / "grandchild"
    sup, _ = _start(tmp_path, "--restart", "never", "--", "sh", "-c",
                    f'sleep 60 & echo $! > {pidfile}; exit 4')  # fmt: skip
    assert sup.wait(timeout=20) == 4
    _wait(lambda: not _alive(int(pidfile.read_text())), timeout=10)
