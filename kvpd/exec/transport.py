"""The narrow interface every transport (local, SSH) implements.

The executor only talks to hosts through this Protocol. Paths are strings as they appear on the
host; a relative path is relative to the host's run directory, which `resolve` turns absolute.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypedDict, runtime_checkable

from kvpd.errors import TransportError

if TYPE_CHECKING:  # annotations only (typing.Unpack is 3.11+)
    from typing_extensions import Unpack


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    exit_code: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


@dataclass(frozen=True)
class Started:
    """A detached process: `pid` leads its own session, so pid == pgid."""

    pid: int
    pgid: int
    start_ticks: int  # field 22 of /proc/<pid>/stat: with pid, identifies this very process
    log: str


class RunOptions(TypedDict, total=False):
    """The keyword options of `Transport.run`, stated once for every transport."""

    timeout_s: float
    env: dict[str, str] | None
    cwd: str | None
    idempotent: bool


@dataclass(frozen=True)
class Run:
    """`RunOptions` with their defaults: what an implementation of `run` reads."""

    timeout_s: float = 60.0
    env: dict[str, str] | None = None
    cwd: str | None = None
    # The command only reads (a process's state, the listening ports): when the link to the
    # host is lost while it runs, the transport runs it again on a new connection instead of
    # reporting that it may or may not have run.
    idempotent: bool = False


HttpMethod = Literal["GET", "POST"]


@dataclass(frozen=True)
class HttpRequest:
    """One HTTP/1.1 exchange with a port on a host. `address` is where the process listens as
    seen from that host (the address in its URL), not as seen from the controller."""

    method: HttpMethod
    address: str
    port: int
    path: str
    body: bytes | None = None
    headers: tuple[tuple[str, str], ...] = ()
    timeout_s: float = 10.0

    def __post_init__(self) -> None:
        words = [self.address, self.path, *(w for kv in self.headers for w in kv)]
        if (
            not self.path.startswith("/")
            or " " in self.path
            or any(c in w for w in words for c in "\r\n\0")
            or not 0 < self.port < 65536
        ):
            raise ValueError(f"refusing a malformed HTTP request to port {self.port}")


@dataclass(frozen=True)
class HttpResponse:
    status: int
    body: bytes


# How an HTTP exchange through a host failed, so callers (the health gate, preflight) can say
# which part of the path is broken: the port (nothing listens), the host's sshd (forwarding
# forbidden), the host itself, or the answer.
ChannelFailure = Literal["refused", "forbidden", "unreachable", "timeout", "bad-answer"]


class ChannelError(TransportError):
    """An HTTP exchange through a transport failed. `detail` is the short form a probe shows
    ("port 7800 refused"); the message is the whole sentence with its fix."""

    def __init__(self, kind: ChannelFailure, detail: str, message: str) -> None:
        super().__init__(message)
        self.kind: ChannelFailure = kind
        self.detail = detail


class Transport(Protocol):
    """Operations on one host. Implementations must be safe to call from several threads."""

    host: str

    def run(self, argv: list[str], **opts: Unpack[RunOptions]) -> CommandResult:
        """Run a command to completion (no shell: argv is quoted by the transport); `opts`:
        `timeout_s` (default 60), `env`, `cwd`."""
        ...

    def put(self, path: str, content: bytes, *, mode: int = 0o644) -> None:
        """Write a file atomically (temporary name + rename), creating parent directories."""
        ...

    def read(self, path: str) -> bytes:
        """Read a whole file; raises FileNotFoundError if it does not exist."""
        ...

    def append(self, path: str, text: str) -> None:
        """Append `text` (no NUL) to a file, creating it 0600 and its missing parent
        directories 0700 (a log kvpd starts may echo secrets); an existing file keeps its
        mode. Raises TransportError (or OSError locally) when the file cannot be written."""
        ...

    def start_detached(
        self, argv: list[str], *, log: str, cwd: str, env: dict[str, str] | None = None
    ) -> Started:
        """Start a process in a new session (setsid) with stdin from /dev/null and stdout and
        stderr appended to `log`; return at once with its PID. It must survive the transport
        closing."""
        ...

    def signal_group(self, pgid: int, sig: int, *, start_ticks: int) -> bool:
        """Send `sig` to process group `pgid` if it is still the group kvpd started: its leader
        started at `start_ticks` (the PID-reuse guard, procfs.may_signal_group). Nothing is
        signalled, and False returned, when the group is gone or can no longer be ours, when
        `start_ticks` is unknown (<= 0), for pgid <= 1 and for the caller's own group."""
        ...

    def alive(self, pid: int, *, start_ticks: int | None = None) -> bool:
        """True if `pid` exists, is not a zombie (state Z counts as gone) and, with
        `start_ticks`, is the same process that was started."""
        ...

    def group_alive(self, pgid: int) -> list[int]:
        """PIDs (non-zombie) still in process group `pgid` (from /proc), empty when all gone."""
        ...

    def ports_listening(self, ports: list[int]) -> list[int]:
        """Which of `ports` have a listening TCP socket on the host (from /proc/net/tcp{,6})."""
        ...

    def resolve(self, path: str) -> str:
        """Absolute form of `path` on the host (relative paths: under the home/cwd)."""
        ...

    def http(self, request: HttpRequest) -> HttpResponse:
        """One HTTP exchange with `request.address:request.port` as the host reaches it (over
        SSH: a direct-tcpip channel of the host's connection, so no port but sshd needs to be
        reachable from the controller). Any status is a response; raises ChannelError when no
        answer came."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class Streams(Protocol):
    """A transport that also carries a raw byte stream to a port of its host (what `kvpd
    forward` relays): the SSH transport (a direct-tcpip channel) and the local one (a socket).
    The stream has recv, sendall, shutdown and close, like a socket."""

    def open_stream(self, address: str, port: int, *, timeout_s: float = 10.0) -> Any: ...


class Transports(Protocol):
    """Transports by host name: a dict, or a TransportPool that opens them on first use."""

    def __getitem__(self, name: str) -> Transport: ...
