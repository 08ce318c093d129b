"""A scripted stand-in for a host, for fast tests of code that drives transports (the
executor, the stopper, preflight) and for faults no real host gives on demand: a process whose
PID is reused, a host that stops answering, a process that ignores SIGTERM.

FakeTransport implements kvpd.exec.transport.Transport without touching the machine: files
live in a dict, processes in a table of /proc-style records judged by the same rules
(kvpd.exec.procfs) as on real hosts. What a started program does is scripted with
`script(name, FakeProgram(...))`; `tests/unit/test_transport_contract.py` runs one contract
against this fake, the local transport and SSH, so the fake cannot drift from them.
"""

from __future__ import annotations

import itertools
import posixpath
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvpd.errors import TransportError
from kvpd.exec import procfs, run_dirs
from kvpd.exec.channel_errors import CONNECT_FAILED, PROHIBITED, refusal, unreachable
from kvpd.exec.command_words import check_env
from kvpd.exec.lease.host import LEASE_SH
from kvpd.exec.processes import sweep
from kvpd.exec.transport import (
    CommandResult,
    HttpRequest,
    HttpResponse,
    Run,
    RunOptions,
    Started,
)
from kvpd.testing import lease_sh

if TYPE_CHECKING:  # annotations only (typing.Unpack is 3.11+)
    from typing_extensions import Unpack

NOT_FOUND = 127


@dataclass(frozen=True)
class FakeProgram:
    """What a program does when started: the lines it writes to its log, the ports it listens
    on while it lives, whether it exits at once (with `exit_code`) and whether it ignores
    SIGTERM (then only SIGKILL stops it)."""

    output: str = ""
    ports: tuple[int, ...] = ()
    exit_code: int | None = None  # None: runs until signalled
    ignore_term: bool = False


@dataclass
class FakeProcess:
    pid: int
    pgid: int
    sid: int
    start_ticks: int
    argv: tuple[str, ...]
    program: FakeProgram
    env: dict[str, str] = field(default_factory=dict)
    state: str = "S"
    cwd: str = "/"

    @property
    def stat(self) -> procfs.ProcStat:
        return procfs.ProcStat(self.pid, self.state, self.pgid, self.sid, self.start_ticks)


Builtin = Callable[["FakeTransport", list[str]], CommandResult]
# What a port answers: a fixed response, or one computed from the request.
Answer = HttpResponse | Callable[[HttpRequest], HttpResponse]


class FakeTransport:
    """One fake host. Thread-safe (one lock). Relative paths resolve under `home`."""

    def __init__(self, host: str = "fake", *, home: str = "/home/fake") -> None:
        self.host = host
        self.home = home
        self.files: dict[str, bytes] = {}
        self.modes: dict[str, int] = {}
        self.mtimes: dict[str, int] = {}  # written by the lease snippet, by `clock`
        self.clock: Callable[[], float] = time.time  # the host's clock (epoch seconds)
        self.processes: dict[int, FakeProcess] = {}
        self.programs: dict[str, FakeProgram] = {}
        self.commands: dict[str, Builtin] = dict(_BUILTINS)
        self.ran: list[tuple[str, ...]] = []  # every argv given to `run`, for assertions
        self.unreachable = False  # fault: every operation raises TransportError
        self.answers: dict[int, Answer] = {}  # port -> what it answers (see `serve`)
        self.requests: list[HttpRequest] = []  # every request given to `http`
        self.forwarding = True  # False: the host's sshd forbids channels (AllowTcpForwarding)
        self.closed = 0
        self._lock = threading.RLock()
        self._pids = itertools.count(4000)
        self._ticks = itertools.count(100_000, 7)

    # -- scripting and faults ----------------------------------------------------------

    def script(self, name: str, program: FakeProgram) -> None:
        """Started argv whose first word or any word's basename is `name` runs `program`."""
        self.programs[name] = program

    def serve(self, port: int, answer: Answer) -> None:
        """Requests to `port` get `answer`, whether a process listens there or not."""
        self.answers[port] = answer

    def exit(self, pid: int) -> None:
        """The process ends by itself (crash, OOM kill) and is reaped."""
        with self._lock:
            self.processes.pop(pid, None)

    def reuse_pid(self, pid: int) -> FakeProcess:
        """Fault: process `pid` ended long ago and a foreign process now has its number."""
        with self._lock:
            self.processes.pop(pid, None)
            foreign = FakeProcess(pid, pid, pid, next(self._ticks), ("foreign",), FakeProgram())
            self.processes[pid] = foreign
            return foreign

    def _check_reachable(self) -> None:
        if self.unreachable:
            raise TransportError(f"host {self.host}: connection refused (fake: unreachable)")

    # -- Transport ---------------------------------------------------------------------

    def resolve(self, path: str) -> str:
        if path == "~" or path.startswith("~/"):
            path = path[2:]
        return posixpath.normpath(posixpath.join(self.home, path))

    def run(self, argv: list[str], **opts: Unpack[RunOptions]) -> CommandResult:
        o = Run(**opts)
        self._check_reachable()
        check_env(o.env)
        with self._lock:
            self.ran.append(tuple(argv))
            builtin = self.commands.get(posixpath.basename(argv[0])) if argv else None
            if builtin is None:
                return CommandResult(tuple(argv), NOT_FOUND, "", f"{argv[:1]}: not found (fake)")
            return builtin(self, list(argv))

    def put(self, path: str, content: bytes, *, mode: int = 0o644) -> None:
        self._check_reachable()
        with self._lock:
            target = self.resolve(path)
            self.files[target] = bytes(content)
            self.modes[target] = mode

    def read(self, path: str) -> bytes:
        self._check_reachable()
        with self._lock:
            target = self.resolve(path)
            if target not in self.files:
                raise FileNotFoundError(2, f"No such file on host {self.host}", target)
            return self.files[target]

    def append(self, path: str, text: str) -> None:
        self._check_reachable()
        with self._lock:
            target = self.resolve(path)
            self.modes.setdefault(target, 0o600)
            self.files[target] = self.files.get(target, b"") + text.encode()

    def start_detached(
        self, argv: list[str], *, log: str, cwd: str, env: dict[str, str] | None = None
    ) -> Started:
        self._check_reachable()
        check_env(env)
        with self._lock:
            program = self._program(argv)
            pid = next(self._pids)
            proc = FakeProcess(
                pid, pid, pid, next(self._ticks), tuple(argv), program, dict(env or {}),
                cwd=self.resolve(cwd),
            )  # fmt: skip
            log_path = self.resolve(log)
            self.append(log_path, program.output)
            if program.exit_code is None:
                self.processes[pid] = proc
            return Started(pid=pid, pgid=pid, start_ticks=proc.start_ticks, log=log_path)

    def _program(self, argv: list[str]) -> FakeProgram:
        for word in argv:
            found = self.programs.get(posixpath.basename(word))
            if found is not None:
                return found
        raise TransportError(
            f"host {self.host}: starting {argv[0]!r} failed: command not found "
            "(fake: no program scripted for it)"
        )

    def alive(self, pid: int, *, start_ticks: int | None = None) -> bool:
        self._check_reachable()
        with self._lock:
            p = self.processes.get(pid)
            return procfs.is_alive(p.stat if p else None, start_ticks)

    def group_alive(self, pgid: int) -> list[int]:
        self._check_reachable()
        with self._lock:
            return sorted(s.pid for s in self._members(pgid))

    def _members(self, pgid: int) -> list[procfs.ProcStat]:
        return procfs.live_members((p.stat for p in self.processes.values()), pgid)

    def signal_group(self, pgid: int, sig: int, *, start_ticks: int) -> bool:
        self._check_reachable()
        with self._lock:
            leader = self.processes.get(pgid)
            members = self._members(pgid)
            if not procfs.may_signal_group(
                pgid, leader.stat if leader else None, members, start_ticks
            ):
                return False
            for st in members:
                p = self.processes[st.pid]
                if sig == signal.SIGKILL or (sig in (signal.SIGTERM, signal.SIGINT)
                                             and not p.program.ignore_term):  # fmt: skip
                    del self.processes[st.pid]
            return True

    def ports_listening(self, ports: list[int]) -> list[int]:
        self._check_reachable()
        with self._lock:
            open_ports = {q for p in self.processes.values() for q in p.program.ports}
            return [p for p in ports if p in open_ports]

    def http(self, request: HttpRequest) -> HttpResponse:
        """A scripted answer (`serve`); else 200 from a live process listening on the port;
        else refused, as the SSH transport words it."""
        r, h = request, self.host
        if self.unreachable:
            raise unreachable(h, TransportError(f"host {h}: connection refused (fake)"))
        if not self.forwarding:
            raise refusal(h, "fake", r.address, r.port, PROHIBITED, "(fake)", own=True)
        with self._lock:
            self.requests.append(request)
            answer = self.answers.get(request.port)
            listening = any(request.port in p.program.ports for p in self.processes.values())
        if answer is not None:
            return answer if isinstance(answer, HttpResponse) else answer(request)
        if listening:
            return HttpResponse(200, b"")
        raise refusal(h, "fake", r.address, r.port, CONNECT_FAILED, "(fake)", own=True)

    def close(self) -> None:
        self.closed += 1  # processes outlive the connection, as on a real host


# -- the few commands kvpd runs on hosts -------------------------------------------------


def _ok(argv: list[str], out: str = "") -> CommandResult:
    return CommandResult(tuple(argv), 0, out, "")


def _fail(argv: list[str], err: str, code: int = 1) -> CommandResult:
    return CommandResult(tuple(argv), code, "", err)


def _operands(argv: list[str]) -> list[str]:
    return [a for a in argv[1:] if not a.startswith("-")]


def _mkdir(t: FakeTransport, argv: list[str]) -> CommandResult:
    return _ok(argv)  # directories are implicit in the fake file table


def _rm(t: FakeTransport, argv: list[str]) -> CommandResult:
    for path in _operands(argv):
        root = t.resolve(path)
        for f in [f for f in t.files if f == root or f.startswith(root.rstrip("/") + "/")]:
            del t.files[f]
    return _ok(argv)


def _tail(t: FakeTransport, argv: list[str]) -> CommandResult:
    n = int(argv[argv.index("-n") + 1])
    path = t.resolve(argv[-1])
    if path not in t.files:
        return _fail(argv, f"tail: cannot open '{argv[-1]}' for reading: No such file")
    lines = t.files[path].decode(errors="replace").splitlines(keepends=True)
    return _ok(argv, "".join(lines[-n:]) if n else "")


def _stat(t: FakeTransport, argv: list[str]) -> CommandResult:
    path = t.resolve(argv[-1])
    if path not in t.files:
        return _fail(argv, f"stat: cannot statx '{argv[-1]}': No such file")
    return _ok(argv, f"{len(t.files[path])}\n")


def _under(t: FakeTransport, d: str) -> list[str]:
    return [f for f in t.files if f.startswith(d.rstrip("/") + "/")]


def _sh(t: FakeTransport, argv: list[str]) -> CommandResult:
    # Only kvpd's run-dir scripts (kvpd.exec.run_dirs): sh -c SCRIPT NAME DIR MARKER TEXT ...
    # and its lease snippet (kvpd.testing.lease_sh)
    if argv[1:3] == ["-c", LEASE_SH]:
        return lease_sh.run(t, argv)
    if argv[1:3] == ["-c", sweep.SWEEP_SH]:
        return _sweep(t, argv)
    if argv[1:2] != ["-c"] or argv[2] not in (run_dirs.MARK_SH, run_dirs.PURGE_SH):
        return _fail(argv, "sh: this script is not scripted in the fake", NOT_FOUND)
    d, marker, text = t.resolve(argv[4]), argv[5], (argv[6] + "\n").encode()
    mark = posixpath.join(d, marker)
    if argv[2] == run_dirs.MARK_SH:
        if not _under(t, d):
            t.files[mark], t.modes[mark] = text, 0o600
        return _ok(argv)
    if not _under(t, d):
        return _ok(argv)
    if t.files.get(mark) != text:
        return _fail(argv, "", 4)
    for name in [*argv[7:], marker]:
        _rm(t, ["rm", "-rf", "--", posixpath.join(d, name)])
    left = sorted({f[len(d) + 1 :].split("/", 1)[0] for f in _under(t, d)})
    return CommandResult(tuple(argv), 5, "\n".join(left), "") if left else _ok(argv)


def _sweep(t: FakeTransport, argv: list[str]) -> CommandResult:
    """sweep.SWEEP_SH: sh -c SCRIPT NAME KVPD_DEPLOYMENT=<name> RUN_DIR."""
    key, _, value = argv[4].partition("=")
    d = t.resolve(argv[5]).rstrip("/")
    lines = []
    for p in sorted(t.processes.values(), key=lambda p: p.pid):
        if p.env.get(key) != value or not (p.cwd == d or p.cwd.startswith(d + "/")):
            continue
        st = p.stat
        fields = ["0"] * 15 + [str(st.start_ticks)]  # fields 7-22
        stat = f"{st.pid} (fake) {st.state} 1 {st.pgid} {st.sid} {' '.join(fields)}"
        lines.append(f"{p.env.get(sweep.PROCESS_ENV, '')}\t{stat}\n")
    return _ok(argv, "".join(lines))


_BUILTINS: dict[str, Builtin] = {
    "sh": _sh,
    "true": lambda t, argv: _ok(argv),
    "false": lambda t, argv: _fail(argv, ""),
    "mkdir": _mkdir,
    "rm": _rm,
    "tail": _tail,
    "stat": _stat,
}
