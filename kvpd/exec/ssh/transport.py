"""The transport for remote hosts: one pooled paramiko connection per host, reconnected once
when found dropped; commands quoted (commands.py), /proc text judged by procfs like locally."""

from __future__ import annotations

import posixpath
import threading
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import paramiko

from kvpd.errors import TransportError
from kvpd.exec import http_wire
from kvpd.exec.channel_errors import unreachable
from kvpd.exec.ssh import channels, commands, sftp
from kvpd.exec.ssh.config import Route, load_ssh_config, route
from kvpd.exec.ssh.connect import LINK_ERRORS, Connection, Unstarted, connect
from kvpd.exec.ssh.processes import ShellProcesses, started, started_pid
from kvpd.exec.ssh.timed import drive
from kvpd.exec.transport import (
    ChannelError,
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

T = TypeVar("T")

# OpenSSH allows 10 sessions per connection by default (MaxSessions); one is kept for SFTP.
MAX_PARALLEL_CHANNELS = 8
# direct-tcpip channels do not count against MaxSessions; this bounds one host's open ones.
MAX_PARALLEL_FORWARDS = 16


def link_error(e: BaseException | None) -> str:
    """A lost link's exception as words: paramiko's EOFError and some of its SSHExceptions
    carry no message, so their type is the text."""
    if e is None:
        return "no reason given"
    return str(e) or type(e).__name__


class SSHTransport(ShellProcesses):
    """Operations on one host over one SSH connection, opened on first use and shared by all
    threads (channels are multiplexed; at most MAX_PARALLEL_CHANNELS at a time). A connection
    found dropped is re-opened once per operation. Relative paths are relative to the login
    (home) directory. `ssh_config`: the file to read (default $KVPD_SSH_CONFIG or
    ~/.ssh/config); the host's own fields win over it."""

    def __init__(
        self,
        host: HostSpec,
        *,
        accept_unknown_host_key: bool = False,
        connect_timeout_s: float = 10,
        ssh_config: str | None = None,
    ) -> None:
        self.spec = host
        self.host = host.name
        self.route: Route = route(host, load_ssh_config(ssh_config))
        self.user = self.route.target.user
        self.known_hosts = self.route.known_hosts
        self.accept_unknown_host_key = accept_unknown_host_key
        self.connect_timeout_s = connect_timeout_s
        self._lock = threading.Lock()  # guards _conn (connect / reconnect)
        self._sftp_lock = threading.Lock()  # one SFTP request stream at a time
        self._channels = threading.BoundedSemaphore(MAX_PARALLEL_CHANNELS)
        self._forwards = threading.BoundedSemaphore(MAX_PARALLEL_FORWARDS)
        self._conn: Connection | None = None
        self._home: str | None = None

    def __repr__(self) -> str:
        return f"SSHTransport({self.host}: {self._where})"

    @property
    def _where(self) -> str:
        t = self.route.target
        via = " via " + ",".join(j.address for j in self.route.jumps) if self.route.jumps else ""
        return f"{t.user}@{t.address}:{t.port}{via}"

    # -- connection --------------------------------------------------------------------

    def connect(self) -> None:
        """Open the connection now (it is otherwise opened by the first operation)."""
        self._connection()

    def _connection(self, stale: Connection | None = None) -> Connection:
        """The live connection; with `stale`, replace that one (if nobody did already)."""
        with self._lock:
            if self._conn is not None and (self._conn is stale or not self._conn.active):
                self._conn.close()
                self._conn = None
            if self._conn is None:
                self._conn = connect(
                    self.route,
                    self.host,
                    accept_unknown_host_key=self.accept_unknown_host_key,
                    timeout_s=self.connect_timeout_s,
                )
            return self._conn

    def _with_retry(self, what: str, op: Callable[[Connection], T]) -> T:
        """Run `op` on the connection; if the link is found dropped before the operation could
        start, reconnect once and retry. `op` must raise Unstarted only when nothing reached
        the host, or when running it again changes nothing (an idempotent command)."""
        conn = self._connection()
        try:
            return op(conn)
        except Unstarted as e:
            first = e.__cause__
        try:
            return op(self._connection(stale=conn))
        except Unstarted as e:
            cause = e.__cause__
            raise TransportError(
                f"host {self.host} ({self._where}): {what} failed: the connection was lost, "
                f"and again on a new one: {link_error(cause or first)}. Fix: check the host is "
                "up and reachable."
            ) from cause

    # -- commands ----------------------------------------------------------------------

    def _exec(
        self, command: str, timeout_s: float, idempotent: bool = False
    ) -> tuple[int, bytes, bytes, bool]:
        """Run a shell command line; (exit code, stdout, stderr, timed out). On timeout the
        remote command's process group is killed: closing the channel alone leaves it running.
        An idempotent command whose link is lost while it runs is run again on a new one."""
        # sshd runs the login shell as the leader of a new session, and `exec` keeps that PID
        # and group, so the first stderr line names the group to kill on timeout (and the
        # start time that proves it is still that group).
        wrapped = commands.SELF_IDENTITY + command

        def op(conn: Connection) -> tuple[int, bytes, bytes, bool]:
            with self._channels:
                chan = conn.session(self.connect_timeout_s)
                try:
                    code, out, err, timed_out = drive(chan, wrapped, timeout_s)
                    first, _, err = err.partition(b"\n")
                    if timed_out and (ident := commands.self_identity(first)) is not None:
                        self._kill_timed_out(*ident)
                    return code, out, err, timed_out
                except LINK_ERRORS as e:
                    if idempotent:
                        raise Unstarted from e
                    raise TransportError(
                        f"host {self.host} ({self._where}): connection lost while running "
                        f"{command[:200]!r}: {link_error(e)}. The command may or may not have "
                        "run; check the host."
                    ) from e
                finally:
                    chan.close()

        return self._with_retry("running a command", op)

    def _kill_timed_out(self, pgid: int, start_ticks: int) -> None:
        try:  # a timed-out command is already a failure: best effort
            conn = self._connection()
            snippet = commands.kill_later_snippet(pgid, start_ticks)
            drive(conn.session(self.connect_timeout_s), snippet, 10.0)
        except Exception:  # noqa: BLE001
            pass

    def run(self, argv: list[str], **opts: Unpack[RunOptions]) -> CommandResult:
        o = Run(**opts)
        secret, env = commands.split_secret_env(o.env)
        command = self._secret_prefix(secret) + commands.command_line(
            list(argv), env=env, cwd=o.cwd
        )
        return self._result(tuple(argv), command, o.timeout_s, o.idempotent)

    def _secret_prefix(self, secret: dict[str, str]) -> str:
        """Secret variables go through a private file the command sources and deletes, never
        through the command line sshd runs (`ps` shows it to every local user)."""
        if not secret:
            return ""
        path = posixpath.join(self.home(), f".kvpd-env-{uuid.uuid4().hex}")
        self.put(path, commands.env_file(secret), mode=0o600)
        return commands.source_and_remove(path)

    def shell(
        self, script: str, *, timeout_s: float = 60.0, idempotent: bool = False
    ) -> CommandResult:
        """Run a trusted shell snippet written by kvpd itself (never built from plan values)."""
        return self._result(("sh", "-c", script), script, timeout_s, idempotent)

    def _result(
        self, argv: tuple[str, ...], command: str, timeout_s: float, idempotent: bool = False
    ) -> CommandResult:
        code, out, err, timed_out = self._exec(command, timeout_s, idempotent)
        stderr = err.decode(errors="replace")
        if timed_out:
            # Closing the channel does not stop the remote command; it loses its output pipes.
            stderr += f"\ntimed out after {timeout_s}s"
        return CommandResult(argv, code, out.decode(errors="replace"), stderr)

    def _snippet(
        self, script: str, what: str, timeout_s: float = 30.0, *, idempotent: bool = False
    ) -> str:
        r = self.shell(script, timeout_s=timeout_s, idempotent=idempotent)
        if not r.ok:
            raise TransportError(
                f"host {self.host} ({self._where}): {what} failed (exit {r.exit_code}): "
                f"{r.stderr.strip()[-500:]}"
            )
        return r.stdout

    # -- paths and files ---------------------------------------------------------------

    def home(self) -> str:
        if self._home is None:
            # A session starts in the login directory (the connection's first session printed
            # it); cached, it never changes.
            home = self._connection().login_dir or ""
            if not home.startswith("/"):
                home = self._snippet("pwd", "finding the home directory", idempotent=True).strip()
            if not home.startswith("/"):
                raise TransportError(f"host {self.host}: odd home directory {home!r}")
            self._home = home
        return self._home

    def resolve(self, path: str) -> str:
        if path == "~" or path.startswith("~/"):
            path = path[2:]
        if path.startswith("/"):
            return posixpath.normpath(path)
        return posixpath.normpath(posixpath.join(self.home(), path))

    def put(self, path: str, content: bytes, *, mode: int = 0o644) -> None:
        target = self.resolve(path)
        tmp = sftp.temp_name(target)

        def op(conn: Connection) -> None:
            with self._sftp_lock:
                client = conn.open_sftp()
                try:
                    sftp.write_temp(client, tmp, content, mode)
                    try:
                        client.posix_rename(tmp, target)
                    except OSError:
                        # Server without the posix-rename extension: rename(2) via the shell.
                        r = self.run(["mv", "-f", "--", tmp, target])
                        if not r.ok:
                            raise OSError(r.stderr.strip() or "mv failed") from None
                except PermissionError:
                    sftp.discard(client, tmp)
                    raise
                except OSError as e:
                    sftp.discard(client, tmp)
                    if not conn.active:
                        raise TransportError(
                            f"host {self.host} ({self._where}): connection lost writing "
                            f"{target}: {e}"
                        ) from e
                    raise TransportError(
                        f"host {self.host}: cannot write {target}: {e}. Fix: check that the "
                        f"directory is writable by {self.user} and the disk is not full."
                    ) from e
                except (paramiko.SSHException, EOFError) as e:
                    raise TransportError(
                        f"host {self.host} ({self._where}): writing {target} failed: {e}"
                    ) from e

        self._with_retry(f"writing {target}", op)

    def read(self, path: str) -> bytes:
        target = self.resolve(path)

        def op(conn: Connection) -> bytes:
            with self._sftp_lock:
                client = conn.open_sftp()
                try:
                    return sftp.read_all(client, target)
                except FileNotFoundError:
                    raise FileNotFoundError(
                        2, f"No such file on host {self.host}", target
                    ) from None
                except PermissionError:
                    raise
                except (OSError, EOFError, paramiko.SSHException) as e:
                    if not conn.active:  # the link, not the file: reading again is harmless
                        raise Unstarted from e
                    raise TransportError(f"host {self.host}: cannot read {target}: {e}") from e

        return self._with_retry(f"reading {target}", op)

    def append(self, path: str, text: str) -> None:
        # Through the shell, not SFTP: an SFTP open cannot create the file 0600 atomically.
        target = self.resolve(path)
        r = self.run(commands.append_argv(target, text), timeout_s=30)
        if not r.ok:
            raise TransportError(f"host {self.host}: cannot append to {target}: {r.stderr.strip()}")

    # -- processes ---------------------------------------------------------------------

    def start_detached(
        self, argv: list[str], *, log: str, cwd: str, env: dict[str, str] | None = None
    ) -> Started:
        log_path = self.resolve(log)
        cwd_path = self.resolve(cwd)
        secret, rest = commands.split_secret_env(env)
        script = self._secret_prefix(secret) + commands.detached_command_line(
            list(argv), log=log_path, cwd=cwd_path, env=rest
        )
        code, out, err, timed_out = self._exec(script, 30.0)
        text = out.decode(errors="replace")
        lines = text.splitlines()
        if timed_out or code != 0 or started_pid(lines) is None:
            why = "timed out" if timed_out else f"exit {code}"
            raise TransportError(
                f"host {self.host}: starting {argv[0]!r} in {cwd_path} failed ({why}): "
                f"{err.decode(errors='replace').strip()[-500:] or text.strip()[-500:]}. "
                "Fix: check that the directory exists and the log directory is writable."
            )
        return started(lines, log_path)

    # -- ports on the host -------------------------------------------------------------

    def open_stream(self, address: str, port: int, *, timeout_s: float = 10.0) -> paramiko.Channel:
        """A direct-tcpip channel to `address:port` as this host reaches it."""
        wait = min(timeout_s, self.connect_timeout_s)
        own = (self.spec.address, self.route.target.address)

        def op(conn: Connection) -> paramiko.Channel:
            return channels.open_to(conn, self.host, self.user, address, port, wait, own=own)

        try:
            return self._with_retry(f"reaching {address}:{port}", op)
        except ChannelError:
            raise
        except TransportError as e:  # no connection to the host at all
            raise unreachable(self.host, e) from None

    def http(self, request: HttpRequest) -> HttpResponse:
        with self._forwards:
            chan = self.open_stream(request.address, request.port, timeout_s=request.timeout_s)
            try:
                return http_wire.exchange(chan, request, self.host)
            finally:
                chan.close()

    def close(self) -> None:
        """Close the connection (a later operation opens a new one); detached processes keep
        running."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
