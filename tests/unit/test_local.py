"""LocalTransport against real processes and /proc: zombies, PID reuse, groups, ports, files."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from kvpd.exec.local import LocalTransport, listening_ports, read_stat
from kvpd.exec.procfs import parse_stat
from kvpd.testing.clock import wait_for


def test_parse_stat_with_parentheses_in_name() -> None:
    fields = " ".join(["S", "1", "42", "42"] + ["0"] * 15 + ["987654"] + ["0"] * 10)
    st = parse_stat(f"4242 (we(ird) name)) {fields}")
    assert st is not None
    assert (st.pid, st.state, st.pgid, st.sid, st.start_ticks) == (4242, "S", 42, 42, 987654)


def test_run_put_read(tmp_path: Path) -> None:
    t = LocalTransport(base_dir=str(tmp_path))
    r = t.run(["sh", "-c", 'printf "%s" "$1"; echo err >&2; exit 3', "x", "a b;$(id)"])
    assert (r.exit_code, r.stdout, r.stderr.strip()) == (3, "a b;$(id)", "err")
    assert t.run(["definitely-not-a-command-kvpd"]).exit_code == 127
    assert t.run(["sleep", "5"], timeout_s=0.2).exit_code == 124
    t.put("a/b/c.sh", b"echo hi\n", mode=0o700)
    p = tmp_path / "a/b/c.sh"
    assert p.read_bytes() == b"echo hi\n"
    assert (p.stat().st_mode & 0o777) == 0o700
    assert t.read("a/b/c.sh") == b"echo hi\n"
    assert [x.name for x in p.parent.iterdir()] == ["c.sh"]  # no temp file left behind
    with pytest.raises(FileNotFoundError):
        t.read("missing")
    assert t.resolve("x/../y") == str(tmp_path / "y")


def test_start_detached_survives_and_logs(tmp_path: Path) -> None:
    t = LocalTransport(base_dir=str(tmp_path))
    (tmp_path / "log.txt").write_text("old line\n")
    s = t.start_detached(
        ["bash", "-c", 'echo "out $X"; echo err >&2; read -t 1 line || echo "stdin closed"'],
        log="log.txt",
        cwd=".",
        env={"X": "1"},
    )
    try:
        assert s.pid == s.pgid
        assert s.start_ticks == read_stat(s.pid).start_ticks
        assert os.getsid(s.pid) == s.pid  # its own session
        assert wait_for(lambda: not t.alive(s.pid))  # exited and reaped by kvpd: no zombie
        assert not Path(f"/proc/{s.pid}").exists() or read_stat(s.pid).pgid != s.pid  # type: ignore[union-attr]
        text = (tmp_path / "log.txt").read_text()
        assert text.startswith("old line\n")
        assert "out 1" in text
        assert "err" in text
        assert "stdin closed" in text
    finally:
        try:
            os.killpg(s.pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_zombie_counts_as_dead() -> None:
    # A child we deliberately do not reap stays a zombie: alive() must say dead anyway.
    proc = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        t = LocalTransport()
        assert t.alive(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)
        assert wait_for(lambda: read_stat(proc.pid).state == "Z")  # type: ignore[union-attr]
        assert not t.alive(proc.pid)
        assert t.group_alive(proc.pid) == []
        zombie = read_stat(proc.pid)
        assert zombie is not None
        assert not t.signal_group(proc.pid, signal.SIGTERM, start_ticks=zombie.start_ticks)
    finally:
        proc.kill()
        proc.wait()


def test_pid_reuse_guard() -> None:
    t = LocalTransport()
    s = t.start_detached(["sleep", "30"], log="/dev/null", cwd="/")
    try:
        other = s.start_ticks + 1  # as if the PID now belonged to a later process
        assert t.alive(s.pid, start_ticks=s.start_ticks)
        assert not t.alive(s.pid, start_ticks=other)
        assert not t.signal_group(s.pgid, signal.SIGTERM, start_ticks=other)
        assert t.alive(s.pid)  # untouched
        assert t.signal_group(s.pgid, signal.SIGTERM, start_ticks=s.start_ticks)
        assert wait_for(lambda: not t.alive(s.pid))
        assert not t.signal_group(s.pgid, signal.SIGTERM, start_ticks=s.start_ticks)
    finally:
        try:
            os.killpg(s.pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_group_outlives_leader() -> None:
    t = LocalTransport()
    s = t.start_detached(["bash", "-c", "sleep 30 & sleep 0.1"], log="/dev/null", cwd="/")
    try:
        assert wait_for(lambda: not t.alive(s.pid))
        members = t.group_alive(s.pgid)
        assert len(members) == 1
        assert members[0] != s.pid
        # Leader gone: signalled only if members are in our session and not older than it.
        assert not t.signal_group(s.pgid, signal.SIGTERM, start_ticks=s.start_ticks + 10**9)
        assert t.group_alive(s.pgid) == members
        assert t.signal_group(s.pgid, signal.SIGTERM, start_ticks=s.start_ticks)
        assert wait_for(lambda: t.group_alive(s.pgid) == [])
    finally:
        try:
            os.killpg(s.pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.parametrize("family,addr", [(socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")])
def test_ports_listening(family: int, addr: str) -> None:
    try:
        srv = socket.socket(family)
        srv.bind((addr, 0))
    except OSError:
        pytest.skip(f"{addr} not available")
    with srv:
        port = srv.getsockname()[1]
        t = LocalTransport()
        assert t.ports_listening([port]) == []  # bound, not listening
        srv.listen()
        assert t.ports_listening([port, 1]) == [port]
        assert port in listening_ports()
    assert LocalTransport().ports_listening([port]) == []


def test_import_kvpd_exec_stays_light() -> None:
    code = (
        "import sys, kvpd.exec.executor, kvpd.exec.local, kvpd.exec.pool;"
        "bad = {'typer', 'rich', 'paramiko'} & set(sys.modules); assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_bad_env_names_are_refused_like_over_ssh(tmp_path: Path) -> None:
    from kvpd.errors import PlanError

    t = LocalTransport()
    for name in ("A B", "1X", "A=B", "X;rm"):
        with pytest.raises(PlanError):
            t.run(["true"], env={name: "x"})
        with pytest.raises(PlanError):
            t.start_detached(
                ["true"], log=str(tmp_path / "l.log"), cwd=str(tmp_path), env={name: "x"}
            )
    assert not (tmp_path / "l.log").exists()  # refused before anything was created
