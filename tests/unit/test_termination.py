"""A benchmark stopped by SIGTERM (as `timeout` stops it) stops what it started."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def children(pid: int) -> set[int]:
    """PIDs whose parent is `pid` (from /proc/<pid>/stat: field 4 after the command)."""
    out = set()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        if int(stat.rpartition(")")[2].split()[1]) == pid:
            out.add(int(d.name))
    return out


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def test_sigterm_stops_the_benchmarks_backends_and_proxy(tmp_path: Path) -> None:
    # stderr goes to a file, not a pipe nobody reads while the benchmark runs: its children
    # inherit it, and a full pipe would block a writer (a hang this test would blame on SIGTERM).
    # faulthandler lets a hang be shown: SIGABRT dumps every thread's stack into that file.
    err_path = tmp_path / "stderr.txt"
    err = err_path.open("w")
    bench = subprocess.Popen(
        [sys.executable, "-X", "faulthandler", str(REPO / "benchmarks" / "proxy_overhead.py"),
         "--streams", "1", "--reps", "50", "--duration", "2"],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=err, text=True,
    )  # fmt: skip
    err.close()
    started: set[int] = set()
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(started) < 2:  # stand-in backends + proxy
            started = children(bench.pid)
            time.sleep(0.2)
        assert len(started) >= 2, err_path.read_text() if bench.poll() is not None else started
        time.sleep(1.0)  # measuring now
        bench.send_signal(signal.SIGTERM)
        try:
            code = bench.wait(timeout=180)  # stops its children within seconds; slack for load
        except subprocess.TimeoutExpired:
            left = children(bench.pid)
            bench.send_signal(signal.SIGABRT)  # faulthandler: the stacks of the hang
            bench.wait(timeout=30)
            pytest.fail(f"the benchmark did not exit after SIGTERM (children {left}):\n"
                        f"{err_path.read_text()[-6000:]}")  # fmt: skip
        assert code != 0, err_path.read_text()
        time.sleep(0.5)
        assert [p for p in started if alive(p)] == []
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
        for p in started:  # the benchmark's own children, seen above: never left behind
            if alive(p):
                os.kill(p, signal.SIGKILL)


# A SIGTERM that arrives while a uvloop protocol callback runs: the signal's handler runs inside
# data_received, where an exception would be reported by uvloop as a transport error and dropped,
# leaving the coroutine that awaits the reply waiting forever.
_SIGTERM_IN_A_CALLBACK = """
import asyncio, os, signal, sys
import uvloop
from kvpd.testing.termination import stop_on_termination

class Echo(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport = transport
    def data_received(self, data):
        os.kill(os.getpid(), signal.SIGTERM)  # the handler runs before this callback returns
        self.transport.write(data)

async def main():
    server = await asyncio.get_running_loop().create_server(Echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"x")
        await asyncio.sleep(3600)
    finally:
        print("unwound", flush=True)

stop_on_termination()
asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
try:
    asyncio.run(main())
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(0)
"""


def test_sigterm_inside_an_event_loop_callback_unwinds_the_main_task() -> None:
    pytest.importorskip("uvloop")
    out = subprocess.run(
        [sys.executable, "-c", _SIGTERM_IN_A_CALLBACK],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["unwound", "interrupted"], out.stdout + out.stderr
