"""The node-side supervisor: runs one engine/service/proxy and restarts it per its policy.

Node side: standard library only. A launch script ends with
`exec python3 -m kvpd.supervisor --status FILE [policy] -- COMMAND...` (built by
`kvpd.plan.supervision`, the one place that spells this invocation), so the supervisor is the
process `kvpd up` records, and the command runs as its child in a process group of its own.

- on-failure: a child that exits non-zero or by a signal is started again after a backoff
  (doubling from --backoff, at most 60 s), unless it already restarted --max-restarts times
  within the last --window seconds: then the supervisor records "failed" and exits with the
  child's status, so `kvpd status` sees it dead and shows the log tail.
- never: the child's exit ends the supervisor (with the child's status).
- --ready-url: a child that exits before its health URL ever answered 200 is not restarted
  (it never came up: a configuration problem, which `kvpd up` reports at once instead of
  waiting out its health timeout over restarts).
- SIGTERM/SIGINT/SIGHUP: no more restarts; the child's group gets SIGTERM, then SIGKILL after
  --grace seconds; the supervisor exits when the child is gone. If the supervisor itself is
  killed, the kernel kills the child (PR_SET_PDEATHSIG), so no engine outlives it unnoticed.

Every start, exit code and signal goes to the status file (JSON, replaced atomically).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from typing import Any

_PR_SET_PDEATHSIG = 1
_KEEP = 20  # starts/exits kept in the status file
_MAX_BACKOFF_S = 60.0


def _die_with_parent() -> None:
    """In the child before exec: own session and process group (sid == pgid == its PID, the
    identity `kvpd down`'s PID-reuse guard checks); SIGKILL when the supervisor dies."""
    os.setsid()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the supervisor's own SIGTERM path remains
        pass


def start_ticks(pid: int) -> int:
    """Field 22 of /proc/<pid>/stat (start time in clock ticks after boot), 0 if unreadable.
    The command name (field 2) may hold spaces and ')', so fields are counted after the last
    ')'."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rpartition(")")[2].split()[19])
    except (OSError, IndexError, ValueError):
        return 0


class Supervisor:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.status_path: str = args.status
        self.stopping = False
        self.child: subprocess.Popen[bytes] | None = None
        # Set before the child is reaped: from then on its number may belong to another
        # process, so nothing signals it (the signal handler reads this).
        self.reaping = False
        self.ready = threading.Event()  # the health URL answered 200 once
        self.status: dict[str, Any] = {
            "name": args.name,
            "supervisor_pid": os.getpid(),
            "policy": {
                "restart": args.restart,
                "max_restarts": args.max_restarts,
                "window_s": args.window,
                "backoff_s": args.backoff,
            },
            "command": args.command,
            "state": "starting",
            "child_pid": None,
            "child_pgid": None,
            "child_start_ticks": 0,
            "restarts": 0,
            "starts": [],
            "exits": [],
        }

    # -- the status file -----------------------------------------------------------------

    def save(self) -> None:
        self.status["updated_at"] = time.time()
        d = os.path.dirname(self.status_path) or "."
        os.makedirs(d, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".sup.", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(self.status, f, indent=1)
        os.replace(tmp, self.status_path)

    def note(self, msg: str) -> None:
        """One line into the process's log (our stderr is its log file), so a restart is
        visible where operators look."""
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        print(f"=== kvpd supervisor {stamp}: {self.args.name}: {msg}", file=sys.stderr, flush=True)

    # -- signals -------------------------------------------------------------------------

    def on_signal(self, signum: int, frame: object) -> None:
        self.stopping = True
        if self.child is not None and not self.reaping:
            self._kill(signal.SIGTERM)

    def _kill(self, sig: int) -> None:
        """Signal the child's group. Only called while the child is unreaped (running or a
        zombie): until it is reaped, the kernel keeps its number, so the group is ours."""
        assert self.child is not None
        if self.reaping:
            return
        try:
            os.killpg(self.child.pid, sig)
        except ProcessLookupError:
            pass

    # -- the loop ------------------------------------------------------------------------

    def start(self) -> None:
        self.child = subprocess.Popen(self.args.command, preexec_fn=_die_with_parent)
        self.reaping = False
        now = time.time()
        pid = self.child.pid
        self.status.update(
            state="running", child_pid=pid, child_pgid=pid, child_start_ticks=start_ticks(pid)
        )
        self.status["starts"] = (self.status["starts"] + [{"at": now, "pid": self.child.pid}])[
            -_KEEP:
        ]
        self.save()

    def exited(self) -> bool:
        """Whether the child has exited, without reaping it (WNOWAIT): it stays a zombie that
        holds its PID and group number until `reap`."""
        assert self.child is not None
        try:
            flags = os.WEXITED | os.WNOHANG | os.WNOWAIT
            return os.waitid(os.P_PID, self.child.pid, flags) is not None
        except ChildProcessError:
            return True

    def reap(self) -> int:
        """End what is left of the child's group (vLLM's engine core may outlive the child)
        while the zombie still holds the number, then reap it."""
        assert self.child is not None
        self._kill(signal.SIGKILL)
        self.reaping = True
        return self.child.wait()

    def wait_child(self) -> int:
        """Wait for the child; after a stop request, SIGKILL its group past the grace."""
        assert self.child is not None
        deadline: float | None = None
        while True:
            if self.exited():
                return self.reap()
            time.sleep(0.2)
            if self.stopping:
                if deadline is None:  # a stop that came while the child was being started
                    self._kill(signal.SIGTERM)
                deadline = deadline or time.monotonic() + self.args.grace
                if time.monotonic() >= deadline:
                    self._kill(signal.SIGKILL)

    def record_exit(self, rc: int) -> None:
        assert self.child is not None
        sig = -rc if rc < 0 else None
        exit_ = {"at": time.time(), "pid": self.child.pid, "code": None if sig else rc,
                 "signal": signal.Signals(sig).name if sig else None}  # fmt: skip
        self.status["exits"] = (self.status["exits"] + [exit_])[-_KEEP:]
        self.status["last_exit"] = exit_

    def recent_restarts(self) -> int:
        cutoff = time.time() - self.args.window
        return sum(1 for s in self.status["starts"][1:] if s["at"] >= cutoff)

    def backoff(self, seconds: float) -> None:
        self.status["state"] = "backoff"
        self.save()
        end = time.monotonic() + seconds
        while not self.stopping and time.monotonic() < end:
            time.sleep(0.1)

    def watch_ready(self) -> None:
        """Poll --ready-url until it answers 200 once (a daemon thread)."""
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        while not self.ready.is_set() and not self.stopping:
            try:
                with opener.open(self.args.ready_url, timeout=2) as resp:
                    if resp.status == 200:
                        self.ready.set()
                        return
            except OSError:
                pass
            time.sleep(0.5)

    def run(self) -> int:
        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(s, self.on_signal)
        if self.args.ready_url:
            threading.Thread(target=self.watch_ready, daemon=True).start()
        else:
            self.ready.set()
        self.start()
        delay = self.args.backoff
        while True:
            rc = self.wait_child()
            self.record_exit(rc)
            how = f"signal {signal.Signals(-rc).name}" if rc < 0 else f"code {rc}"
            if self.stopping:
                self.status["state"] = "stopped"
                self.save()
                return 0
            failed = rc != 0
            if self.args.restart != "on-failure" or not failed:
                self.status["state"] = "exited" if not failed else "failed"
                self.save()
                self.note(f"exited with {how}; not restarting (policy {self.args.restart})")
                return rc if rc >= 0 else 128 - rc
            if not self.ready.is_set():
                self.status["state"] = "failed"
                self.status["gave_up"] = "exited before it was ever ready"
                self.save()
                self.note(f"exited with {how} before it was ever ready; not restarting")
                return rc if rc >= 0 else 128 - rc
            if self.recent_restarts() >= self.args.max_restarts:
                self.status["state"] = "failed"
                self.status["gave_up"] = (
                    f"{self.args.max_restarts} restarts within {self.args.window:g}s"
                )
                self.save()
                self.note(f"exited with {how}; giving up ({self.status['gave_up']})")
                return rc if rc >= 0 else 128 - rc
            self.note(f"exited with {how}; restarting in {delay:g}s")
            self.backoff(delay)
            if self.stopping:
                self.status["state"] = "stopped"
                self.save()
                return 0
            delay = min(_MAX_BACKOFF_S, delay * 2)
            self.status["restarts"] += 1
            self.start()


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m kvpd.supervisor")
    p.add_argument("--status", required=True, help="status file (JSON)")
    p.add_argument("--name", default="process")
    p.add_argument("--restart", choices=("never", "on-failure"), default="on-failure")
    p.add_argument("--max-restarts", type=int, default=3)
    p.add_argument("--window", type=float, default=600.0)
    p.add_argument("--backoff", type=float, default=2.0)
    p.add_argument("--grace", type=float, default=10.0)
    p.add_argument("--ready-url", default="", help="restart only once this answered 200")
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if not args.command:
        p.error("no command after --")
    return args


def main(argv: list[str] | None = None) -> int:
    return Supervisor(parse(sys.argv[1:] if argv is None else argv)).run()


if __name__ == "__main__":
    sys.exit(main())
