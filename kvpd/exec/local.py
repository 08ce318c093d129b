"""The transport for the machine kvpd runs on: subprocess without a shell, /proc for liveness."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from kvpd.exec import http_wire
from kvpd.exec.command_words import check_env
from kvpd.exec.procfs import (
    ProcStat,
    is_alive,
    listening_in,
    live_members,
    may_signal_group,
    parse_stat,
)
from kvpd.exec.transport import (
    CommandResult,
    HttpRequest,
    HttpResponse,
    Run,
    RunOptions,
    Started,
)

if TYPE_CHECKING:  # annotations only (typing.Unpack is 3.11+)
    from typing_extensions import Unpack
from kvpd.plan.value import HostSpec

# Children kvpd itself started, process-wide: any LocalTransport instance reaps them, so a
# stopped child never lingers as a zombie while kvpd runs (PID 1 may reap orphans slowly).
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}
_CHILDREN_LOCK = threading.Lock()


def reap_children() -> None:
    """Collect the exit status of every child kvpd started that has exited."""
    with _CHILDREN_LOCK:
        for pid, proc in list(_CHILDREN.items()):
            if proc.poll() is not None:
                del _CHILDREN[pid]


def private_dirs(path: Path) -> None:
    """`path` and its missing parents, each created 0700 (Path.mkdir gives parents the
    default mode): what kvpd creates for itself no other local user lists or reads."""
    missing = []
    while not path.exists():
        missing.append(path)
        path = path.parent
    for d in reversed(missing):
        d.mkdir(mode=0o700, exist_ok=True)


def replace_with(fd: int, tmp: Path, final: Path, data: bytes) -> None:
    """Write `data` into the new file `fd` (just created at `tmp`, in `final`'s folder, by the
    caller with its own flags and mode), fsync it and rename it over `final`: a reader or a
    crash sees the old content or the new, never a torn one. On any failure (Ctrl-C too) the
    temporary file is removed and the error raised."""
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def open_log(path: Path) -> BinaryIO:
    """Open a log for appending, created 0600; a regular file kept from an earlier run loses
    its group/other bits (engine output may echo requests and secrets)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    st = os.fstat(fd)
    if stat.S_ISREG(st.st_mode) and st.st_mode & 0o077:
        os.fchmod(fd, stat.S_IMODE(st.st_mode) & 0o700)
    return os.fdopen(fd, "ab")


def read_stat(pid: int, proc_root: str = "/proc") -> ProcStat | None:
    """Parse /proc/<pid>/stat; None if the process does not exist."""
    try:
        raw = Path(f"{proc_root}/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return parse_stat(raw)


def all_stats(proc_root: str = "/proc") -> list[ProcStat]:
    """Every process visible in /proc (threads are not listed at the top level)."""
    out = []
    for entry in os.scandir(proc_root):
        if entry.name.isdigit():
            st = read_stat(int(entry.name), proc_root)
            if st is not None:
                out.append(st)
    return out


def listening_ports(proc_root: str = "/proc") -> set[int]:
    """Local ports of TCP sockets in state LISTEN (0A), IPv4 and IPv6, in kvpd's netns."""
    tables = []
    for name in ("tcp", "tcp6"):
        try:
            tables.append(Path(f"{proc_root}/net/{name}").read_text())
        except FileNotFoundError:  # no IPv6 in this kernel/namespace
            continue
    return listening_in(tables)


class LocalTransport:
    """Operations on the local machine. Thread-safe: no shared mutable state but the child
    registry, which has its own lock."""

    def __init__(self, host: HostSpec | None = None, *, base_dir: str | None = None) -> None:
        self.host = host.name if host is not None else "localhost"
        # Relative paths resolve against kvpd's working directory at construction time.
        self._base = os.path.abspath(base_dir or os.getcwd())

    # -- files and commands --------------------------------------------------------------

    def resolve(self, path: str) -> str:
        return os.path.normpath(os.path.join(self._base, os.path.expanduser(path)))

    def run(self, argv: list[str], **opts: Unpack[RunOptions]) -> CommandResult:
        o = Run(**opts)
        # Same rules as over SSH: a name a shell could not export is refused on every host.
        full_env = {**os.environ, **check_env(o.env)} if o.env else None
        try:
            proc = subprocess.run(
                argv,
                capture_output=True,
                timeout=o.timeout_s,
                env=full_env,
                cwd=self.resolve(o.cwd) if o.cwd else self._base,
                stdin=subprocess.DEVNULL,
            )
        except FileNotFoundError as e:  # same code a shell gives for a missing command
            return CommandResult(tuple(argv), 127, "", f"{argv[0]}: {e.strerror}")
        except subprocess.TimeoutExpired as e:
            out = (e.stdout or b"").decode(errors="replace")
            err = (e.stderr or b"").decode(errors="replace")
            return CommandResult(tuple(argv), 124, out, err + f"\ntimed out after {o.timeout_s}s")
        return CommandResult(
            tuple(argv),
            proc.returncode,
            proc.stdout.decode(errors="replace"),
            proc.stderr.decode(errors="replace"),
        )

    def put(self, path: str, content: bytes, *, mode: int = 0o644) -> None:
        target = Path(self.resolve(path))
        private_dirs(target.parent)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(content)
                f.flush()
                os.fchmod(f.fileno(), mode)
                os.fsync(f.fileno())
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def read(self, path: str) -> bytes:
        return Path(self.resolve(path)).read_bytes()

    def append(self, path: str, text: str) -> None:
        target = Path(self.resolve(path))
        private_dirs(target.parent)
        fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "ab") as f:
            f.write(text.encode())

    # -- processes -----------------------------------------------------------------------

    def start_detached(
        self, argv: list[str], *, log: str, cwd: str, env: dict[str, str] | None = None
    ) -> Started:
        # node bundle: like a process started over SSH, a local one does not inherit the
        # controller's PYTHONPATH (where kvpd may be importable from a checkout); the processes
        # that need kvpd get the bundle from their launch script.
        inherited = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        full_env = {**inherited, **check_env(env)}
        log_path = Path(self.resolve(log))
        private_dirs(log_path.parent)
        with open_log(log_path) as logf:
            proc = subprocess.Popen(
                argv,
                cwd=self.resolve(cwd),
                env=full_env,
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
        with _CHILDREN_LOCK:
            _CHILDREN[proc.pid] = proc
        # The child cannot have been reaped yet (only we wait for it), so its stat exists.
        st = read_stat(proc.pid)
        ticks = st.start_ticks if st is not None else 0
        return Started(pid=proc.pid, pgid=proc.pid, start_ticks=ticks, log=str(log_path))

    def alive(self, pid: int, *, start_ticks: int | None = None) -> bool:
        reap_children()
        return is_alive(read_stat(pid), start_ticks)

    def group_alive(self, pgid: int) -> list[int]:
        reap_children()
        return sorted(st.pid for st in live_members(all_stats(), pgid))

    def signal_group(self, pgid: int, sig: int, *, start_ticks: int) -> bool:
        """Signal the group unless it can no longer be ours (procfs.may_signal_group); never
        this process's own group."""
        reap_children()
        pgid = int(pgid)
        if not may_signal_group(
            pgid, read_stat(pgid), live_members(all_stats(), pgid), start_ticks, os.getpgrp()
        ):
            return False
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return False
        return True

    def ports_listening(self, ports: list[int]) -> list[int]:
        listening = listening_ports()
        return [p for p in ports if p in listening]

    def http(self, request: HttpRequest) -> HttpResponse:
        return http_wire.direct(request, self.host)  # this machine: a plain socket

    def open_stream(self, address: str, port: int, *, timeout_s: float = 10.0) -> socket.socket:
        return http_wire.connect(address, port, timeout_s, self.host)

    def close(self) -> None:
        # Detached processes must outlive the transport: nothing to stop here.
        reap_children()
