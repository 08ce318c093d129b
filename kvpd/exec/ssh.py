"""The transport for remote hosts: paramiko over SSH, verified host keys, quoted shell commands."""

from __future__ import annotations

import base64
import getpass
import hashlib
import os
import posixpath
import re
import select
import socket
import stat as stat_mod
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import paramiko

from kvpd.errors import HostKeyError, PlanError, TransportError
from kvpd.exec.local import ProcStat, parse_stat
from kvpd.exec.shellwords import ENV_NAME, check_env, quote_word  # noqa: F401 - re-exported
from kvpd.exec.transport import CommandResult, Started
from kvpd.plan.model import HostSpec

T = TypeVar("T")

# OpenSSH allows 10 sessions per connection by default (MaxSessions); one is kept for SFTP.
MAX_PARALLEL_CHANNELS = 8
# Exit code when the working directory or the command is unusable: what a shell gives for a
# missing command and what LocalTransport returns for both.
NOT_FOUND = 127
# Network-level failures while talking to a host (a dropped connection shows up as any of them).
_LINK_ERRORS = (paramiko.SSHException, EOFError, OSError)


# -- quoting ---------------------------------------------------------------------------------


def command_line(
    argv: list[str], *, env: dict[str, str] | None = None, cwd: str | None = None
) -> str:
    """A POSIX shell command line running `argv` (no shell expansion of any part) with `env`
    added to the login environment, in `cwd` (relative: to the login directory)."""
    _check_argv(argv)
    parts = []
    if cwd is not None:
        parts.append(f"cd -- {quote_word(cwd)} || exit {NOT_FOUND}")
    parts += [f"export {k}={quote_word(v)}" for k, v in check_env(env).items()]
    parts.append("exec " + " ".join(quote_word(a) for a in argv))
    return "; ".join(parts)


def _check_argv(argv: list[str]) -> None:
    if not argv:
        raise PlanError("empty command")
    if argv[0].startswith("-"):
        # `exec`/`setsid` would read it as an option of their own.
        raise PlanError(f"command name must not start with '-': {argv[0]!r}")


def detached_command_line(
    argv: list[str], *, log: str, cwd: str, env: dict[str, str] | None = None
) -> str:
    """Start `argv` in a new session, detached from the SSH channel; print its PID and stat.

    `cd` is a separate statement (`;`, not `&&`): `cd x && cmd &` would background a subshell
    that keeps the channel's stdout open and hangs the session (testbed.md §4.2). Only the
    fully redirected `setsid` command is backgrounded; `setsid` execs in place because a
    background job of a non-interactive shell is not a group leader, so $! is the new PID and
    the new session and process group have that number.
    """
    _check_argv(argv)
    parts = [
        f"mkdir -p -- {quote_word(posixpath.dirname(log) or '.')} || exit {NOT_FOUND}",
        f"cd -- {quote_word(cwd)} || exit {NOT_FOUND}",
    ]
    parts += [f"export {k}={quote_word(v)}" for k, v in check_env(env).items()]
    # Fail here, with a clear message, rather than leave "not found" in the log only.
    parts.append(
        f"command -v -- {quote_word(argv[0])} >/dev/null || "
        f"{{ echo {quote_word('command not found: ' + argv[0])} >&2; exit {NOT_FOUND}; }}"
    )
    cmd = " ".join(quote_word(a) for a in argv)
    parts.append(f"setsid {cmd} >>{quote_word(log)} 2>&1 </dev/null &")
    # `&` already ends the statement; what follows runs in the foreground shell.
    line = "; ".join(parts[:-1]) + "; " + parts[-1]
    return line + ' p=$!; echo "$p"; cat "/proc/$p/stat" 2>/dev/null; exit 0'


def group_stats_snippet(pgid: int) -> str:
    """Print `L <stat>` for the process numbered `pgid` if it exists, then /proc/<pid>/stat of
    every process whose process group is `pgid` (any state)."""
    g = int(pgid)
    # `read` is a builtin: no fork per process. The command name may contain spaces and ')',
    # so the fields are taken after the last ") ".
    return (
        f'{{ read -r s </proc/{g}/stat && printf "L %s\\n" "$s"; }} 2>/dev/null; '
        'for f in /proc/[0-9]*/stat; do { read -r s <"$f"; } 2>/dev/null || continue; '
        'r=${s##*) }; set -- $r; [ "$3" = ' + str(g) + ' ] && printf "%s\\n" "$s"; done; exit 0'
    )


# -- host keys -------------------------------------------------------------------------------


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH-style SHA256 fingerprint of a public key."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def key_file_kind(kind: str) -> str:
    """`ssh-ed25519` -> `ed25519`, `ecdsa-sha2-nistp256` -> `ecdsa`: sshd's host key file names."""
    for short in ("ed25519", "ecdsa", "rsa", "dsa"):
        if short in kind:
            return short
    return kind


def known_hosts_name(address: str, port: int) -> str:
    return address if port == 22 else f"[{address}]:{port}"


_KNOWN_HOSTS_WRITE = threading.Lock()


class _HostKeyPolicy(paramiko.MissingHostKeyPolicy):
    """Unknown key: refuse with the fingerprint and how to accept it, or (with the explicit
    flag) record it in known_hosts. A changed key never reaches this policy: paramiko raises
    BadHostKeyException, which is always refused."""

    def __init__(self, label: str, known_hosts: str, accept: bool) -> None:
        self.label = label
        self.known_hosts = known_hosts
        self.accept = accept

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey):
        kind, fp = key.get_name(), fingerprint(key)
        if not self.accept:
            addr = hostname.strip("[").split("]")[0]
            port = hostname.rsplit(":", 1)[1] if hostname.startswith("[") else "22"
            raise HostKeyError(
                f"{self.label}: unknown host key {kind} {fp} (not in {self.known_hosts}). "
                f"If this is the host's real key (compare with `ssh-keygen -lf "
                f"/etc/ssh/ssh_host_{key_file_kind(kind)}_key.pub` on it), accept it "
                f"with --accept-new-host-keys, or add it yourself: ssh-keyscan -p {port} "
                f"-t {kind} {addr} >> {self.known_hosts}"
            )
        client.get_host_keys().add(hostname, kind, key)
        with _KNOWN_HOSTS_WRITE:
            directory = os.path.dirname(self.known_hosts)
            if directory:
                os.makedirs(directory, mode=0o700, exist_ok=True)
            fd = os.open(self.known_hosts, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            with os.fdopen(fd, "a") as f:
                f.write(f"{hostname} {kind} {key.get_base64()}\n")


# -- the transport ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Hop:
    user: str
    address: str
    port: int


def parse_jump(spec: str | None, default_user: str) -> list[_Hop]:
    """ProxyJump spec `[user@]host[:port][,...]` (IPv6 as `[addr]:port`) into hops."""
    hops: list[_Hop] = []
    for part in (spec or "").split(","):
        part = part.strip()
        if not part:
            continue
        user, _, hostport = part.rpartition("@")
        m = re.fullmatch(r"\[([^\]]+)\](?::(\d+))?|([^:\[\]]+)(?::(\d+))?", hostport)
        if not m:
            raise PlanError(f"invalid jump host {part!r}: expected user@host:port")
        address = m.group(1) or m.group(3)
        port = int(m.group(2) or m.group(4) or 22)
        hops.append(_Hop(user or default_user, address, port))
    return hops


class _Connection:
    """A connected client (plus the jump-host clients it tunnels through) and its SFTP."""

    def __init__(self, client: paramiko.SSHClient, jumps: list[paramiko.SSHClient]) -> None:
        self.client = client
        self.jumps = jumps
        self.sftp: paramiko.SFTPClient | None = None

    @property
    def active(self) -> bool:
        t = self.client.get_transport()
        return t is not None and t.is_active()

    def close(self) -> None:
        for c in [self.client, *reversed(self.jumps)]:
            try:
                c.close()
            except Exception:  # closing a dead connection may raise anything; it is gone
                pass


class SSHTransport:
    """Operations on one host over one SSH connection, opened on first use and shared by all
    threads (channels are multiplexed; at most MAX_PARALLEL_CHANNELS at a time). A connection
    found dropped is re-opened once per operation. Relative paths are relative to the login
    (home) directory."""

    def __init__(
        self,
        host: HostSpec,
        *,
        accept_unknown_host_key: bool = False,
        connect_timeout_s: float = 10,
    ) -> None:
        self.spec = host
        self.host = host.name
        self.user = host.user or getpass.getuser()
        self.accept_unknown_host_key = accept_unknown_host_key
        self.connect_timeout_s = connect_timeout_s
        self.known_hosts = os.path.expanduser(host.known_hosts or "~/.ssh/known_hosts")
        self.key = os.path.expanduser(host.key) if host.key else None
        self._lock = threading.Lock()  # guards _conn (connect / reconnect)
        self._sftp_lock = threading.Lock()  # one SFTP request stream at a time
        self._channels = threading.BoundedSemaphore(MAX_PARALLEL_CHANNELS)
        self._conn: _Connection | None = None
        self._home: str | None = None

    def __repr__(self) -> str:
        return f"SSHTransport({self.host}: {self._where})"

    @property
    def _where(self) -> str:
        via = f" via {self.spec.jump}" if self.spec.jump else ""
        return f"{self.user}@{self.spec.address}:{self.spec.port}{via}"

    # -- connection --------------------------------------------------------------------

    def connect(self) -> None:
        """Open the connection now (it is otherwise opened by the first operation)."""
        self._connection()

    def _connection(self, stale: _Connection | None = None) -> _Connection:
        """The live connection; with `stale`, replace that one (if nobody did already)."""
        with self._lock:
            if self._conn is not None and (self._conn is stale or not self._conn.active):
                self._conn.close()
                self._conn = None
            if self._conn is None:
                self._conn = self._open()
            return self._conn

    def _open(self) -> _Connection:
        hops = parse_jump(self.spec.jump, self.user)
        target = _Hop(self.user, self.spec.address, self.spec.port)
        jumps: list[paramiko.SSHClient] = []
        sock = None
        try:
            for i, hop in enumerate(hops):
                nxt = hops[i + 1] if i + 1 < len(hops) else target
                client = self._client(hop, sock, f"jump host {hop.address} (for {self.host})")
                jumps.append(client)
                try:
                    sock = client.get_transport().open_channel(  # type: ignore[union-attr]
                        "direct-tcpip",
                        (nxt.address, nxt.port),
                        ("127.0.0.1", 0),
                        timeout=self.connect_timeout_s,
                    )
                except _LINK_ERRORS as e:
                    raise TransportError(
                        f"host {self.host}: jump host {hop.address} cannot reach "
                        f"{nxt.address}:{nxt.port}: {e or type(e).__name__}. Fix: check the "
                        "address and that the jump host allows TCP forwarding "
                        "(AllowTcpForwarding in its sshd_config)."
                    ) from e
            client = self._client(target, sock, f"host {self.host}")
        except BaseException:
            for c in reversed(jumps):
                c.close()
            raise
        return _Connection(client, jumps)

    def _client(self, hop: _Hop, sock, label: str) -> paramiko.SSHClient:
        where = f"{hop.user}@{hop.address}:{hop.port}"
        client = paramiko.SSHClient()
        if os.path.exists(self.known_hosts):
            try:
                client.get_host_keys().load(self.known_hosts)
            except (OSError, paramiko.SSHException) as e:
                raise HostKeyError(
                    f"{label}: cannot read known_hosts {self.known_hosts}: {e}. Fix the file "
                    "or point the host's known_hosts setting at a valid one."
                ) from e
        client.set_missing_host_key_policy(
            _HostKeyPolicy(f"{label} ({where})", self.known_hosts, self.accept_unknown_host_key)
        )
        t = self.connect_timeout_s
        try:
            if sock is None:
                sock = socket.create_connection((hop.address, hop.port), timeout=t)
                # Without it, Nagle's algorithm and delayed ACKs add ~40 ms to every exchange.
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            client.connect(
                hop.address,
                port=hop.port,
                username=hop.user,
                key_filename=self.key,
                look_for_keys=self.key is None,
                allow_agent=True,
                sock=sock,
                timeout=t,
                banner_timeout=t,
                auth_timeout=t,
                channel_timeout=t,
            )
        except Exception as e:
            client.close()
            if sock is not None:
                sock.close()
            err = self._connect_error(e, label, where, hop)
            if err is None:
                raise
            raise err from e
        transport = client.get_transport()
        if transport is not None:
            transport.set_keepalive(15)  # notices a dead peer between operations
        return client

    def _connect_error(self, e: Exception, label: str, where: str, hop: _Hop) -> Exception | None:
        """The user-facing error for a failed connect, or None to re-raise `e` as is."""
        t = self.connect_timeout_s
        if isinstance(e, HostKeyError):
            return None
        if isinstance(e, paramiko.BadHostKeyException):
            return HostKeyError(
                f"{label} ({where}): HOST KEY CHANGED, connection refused. known_hosts "
                f"{self.known_hosts} has {e.expected_key.get_name()} "
                f"{fingerprint(e.expected_key)}, the host offered {e.key.get_name()} "
                f"{fingerprint(e.key)}. This can be an attack or a reinstalled host. If you "
                f"have verified the new key, remove the old one with `ssh-keygen -f "
                f"{self.known_hosts} -R {known_hosts_name(hop.address, hop.port)}` and "
                "connect again with --accept-new-host-keys."
            )
        if isinstance(e, paramiko.AuthenticationException):
            how = f"key {self.key}" if self.key else "ssh-agent and ~/.ssh/id_* keys"
            return TransportError(
                f"{label} ({where}): authentication failed with {how}: {e}. Fix: put the "
                f"public key in ~{hop.user}/.ssh/authorized_keys on the host, set the host's "
                "`key`, or load a passphrase-protected key into ssh-agent (ssh-add)."
            )
        if isinstance(e, TimeoutError):
            return TransportError(
                f"{label} ({where}): timed out after {t:g}s connecting. Fix: check the "
                "address and port, that the host is up, and firewalls on the path."
            )
        if isinstance(e, _LINK_ERRORS):
            if "authentication" in str(e).lower():  # e.g. no key and no agent at all
                return TransportError(
                    f"{label} ({where}): {e}. Fix: set the host's `key` or start ssh-agent "
                    "with a key loaded (ssh-add)."
                )
            return TransportError(
                f"{label} ({where}): cannot connect: {e or type(e).__name__}. Fix: check the "
                "address and port and that sshd runs on the host."
            )
        return None

    def _with_retry(self, what: str, op: Callable[[_Connection], T]) -> T:
        """Run `op` on the connection; if the link is found dropped before the operation could
        start, reconnect once and retry. `op` must raise _Unstarted only when nothing reached
        the host."""
        conn = self._connection()
        try:
            return op(conn)
        except _Unstarted as e:
            first = e.__cause__
        try:
            return op(self._connection(stale=conn))
        except _Unstarted as e:
            cause = e.__cause__
            raise TransportError(
                f"host {self.host} ({self._where}): {what} failed, connection lost and "
                f"re-opening it failed: {cause or first}. Fix: check the host is up and "
                "reachable."
            ) from cause

    def _session(self, conn: _Connection) -> paramiko.Channel:
        try:
            transport = conn.client.get_transport()
            if transport is None or not transport.is_active():
                raise EOFError("connection closed")
            return transport.open_session(timeout=self.connect_timeout_s)
        except _LINK_ERRORS as e:
            raise _Unstarted() from e

    def _sftp(self, conn: _Connection) -> paramiko.SFTPClient:
        """The connection's SFTP session (caller holds _sftp_lock)."""
        if not conn.active:
            raise _Unstarted() from EOFError("connection closed")
        if conn.sftp is None:
            try:
                conn.sftp = conn.client.open_sftp()
            except _LINK_ERRORS as e:
                raise _Unstarted() from e
        return conn.sftp

    # -- commands ----------------------------------------------------------------------

    def _exec(self, command: str, timeout_s: float) -> tuple[int, bytes, bytes, bool]:
        """Run a shell command line; (exit code, stdout, stderr, timed out). On timeout the
        remote command's process group is killed: closing the channel alone leaves it running."""
        # sshd runs the login shell as the leader of a new session, and `exec` keeps that PID
        # and group, so the first stderr line names the group to kill on timeout.
        wrapped = "echo $$ >&2; " + command

        def op(conn: _Connection) -> tuple[int, bytes, bytes, bool]:
            with self._channels:
                chan = self._session(conn)
                try:
                    code, out, err, timed_out = self._drive(chan, wrapped, timeout_s)
                    first, _, err = err.partition(b"\n")
                    if timed_out and first.strip().isdigit():
                        self._kill_timed_out(int(first))
                    return code, out, err, timed_out
                except _LINK_ERRORS as e:
                    raise TransportError(
                        f"host {self.host} ({self._where}): connection lost while running "
                        f"{command[:200]!r}: {e or type(e).__name__}. The command may or may "
                        "not have run; check the host."
                    ) from e
                finally:
                    chan.close()

        return self._with_retry("running a command", op)

    def _kill_timed_out(self, pgid: int) -> None:
        # TERM now, KILL after 2 s from a fully redirected background job (so this channel
        # closes at once); a timed-out command is already a failure.
        g = int(pgid)
        script = (
            f"kill -15 -{g} 2>/dev/null; "
            f"(sleep 2; kill -9 -{g}) >/dev/null 2>&1 </dev/null & exit 0"
        )
        try:
            self._drive(self._session(self._connection()), script, 10.0)
        except Exception:  # best effort: the command already failed with a timeout
            pass

    @staticmethod
    def _drive(
        chan: paramiko.Channel, command: str, timeout_s: float
    ) -> tuple[int, bytes, bytes, bool]:
        deadline = time.monotonic() + timeout_s
        out: list[bytes] = []
        err: list[bytes] = []
        chan.exec_command(command)
        chan.shutdown_write()  # stdin is empty: a command reading it sees EOF at once
        while True:
            while chan.recv_ready():
                out.append(chan.recv(65536))
            while chan.recv_stderr_ready():
                err.append(chan.recv_stderr(65536))
            left = deadline - time.monotonic()
            if chan.eof_received and not chan.recv_ready() and not chan.recv_stderr_ready():
                if chan.status_event.wait(max(left, 0)):
                    return chan.recv_exit_status(), b"".join(out), b"".join(err), False
                return 124, b"".join(out), b"".join(err), True
            if left <= 0:
                return 124, b"".join(out), b"".join(err), True
            # The channel's fileno becomes readable on stdout or stderr data and on EOF; the
            # cap only bounds how long a missed wake-up could delay us.
            select.select([chan], [], [], min(left, 0.2))

    def run(
        self,
        argv: list[str],
        *,
        timeout_s: float = 60.0,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
    ) -> CommandResult:
        command = command_line(list(argv), env=env, cwd=cwd)
        code, out, err, timed_out = self._exec(command, timeout_s)
        stderr = err.decode(errors="replace")
        if timed_out:
            # Closing the channel does not stop the remote command; it loses its output pipes.
            stderr += f"\ntimed out after {timeout_s}s"
        return CommandResult(tuple(argv), code, out.decode(errors="replace"), stderr)

    def shell(self, script: str, *, timeout_s: float = 60.0) -> CommandResult:
        """Run a trusted shell snippet written by kvpd itself (never built from plan values)."""
        code, out, err, timed_out = self._exec(script, timeout_s)
        stderr = err.decode(errors="replace") + (
            f"\ntimed out after {timeout_s}s" if timed_out else ""
        )
        return CommandResult(("sh", "-c", script), code, out.decode(errors="replace"), stderr)

    def _snippet(self, script: str, what: str, timeout_s: float = 30.0) -> str:
        r = self.shell(script, timeout_s=timeout_s)
        if not r.ok:
            raise TransportError(
                f"host {self.host} ({self._where}): {what} failed (exit {r.exit_code}): "
                f"{r.stderr.strip()[-500:]}"
            )
        return r.stdout

    # -- paths and files ---------------------------------------------------------------

    def home(self) -> str:
        if self._home is None:
            # The session starts in the login directory; cached, it never changes.
            home = self._snippet("pwd", "finding the home directory").strip()
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
        parent, name = posixpath.split(target)
        tmp = f"{parent}/.{name}.{uuid.uuid4().hex[:12]}.tmp"

        def op(conn: _Connection) -> None:
            with self._sftp_lock:
                sftp = self._sftp(conn)
                try:
                    self._makedirs(sftp, parent)
                    with sftp.open(tmp, "wb") as f:
                        f.set_pipelined(True)
                        f.write(content)
                    sftp.chmod(tmp, mode)
                    try:
                        sftp.posix_rename(tmp, target)
                    except OSError:
                        # Server without the posix-rename extension: rename(2) via the shell.
                        r = self.run(["mv", "-f", "--", tmp, target])
                        if not r.ok:
                            raise OSError(r.stderr.strip() or "mv failed") from None
                except PermissionError:
                    self._discard(sftp, tmp)
                    raise
                except OSError as e:
                    self._discard(sftp, tmp)
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

    @staticmethod
    def _discard(sftp: paramiko.SFTPClient, path: str) -> None:
        try:
            sftp.remove(path)
        except Exception:  # best effort; the link may be gone
            pass

    @staticmethod
    def _makedirs(sftp: paramiko.SFTPClient, directory: str) -> None:
        missing = []
        d = directory
        while d not in ("/", ""):
            try:
                if not stat_mod.S_ISDIR(sftp.stat(d).st_mode or 0):
                    raise NotADirectoryError(f"{d} exists and is not a directory")
                break
            except FileNotFoundError:
                missing.append(d)
                d = posixpath.dirname(d)
        for d in reversed(missing):
            try:
                sftp.mkdir(d)
            except OSError:
                # Another writer may have created it meanwhile; anything else shows on write.
                pass

    def read(self, path: str) -> bytes:
        target = self.resolve(path)

        def op(conn: _Connection) -> bytes:
            with self._sftp_lock:
                sftp = self._sftp(conn)
                try:
                    with sftp.open(target, "rb") as f:
                        f.prefetch()
                        return f.read()
                except FileNotFoundError:
                    raise FileNotFoundError(
                        2, f"No such file on host {self.host}", target
                    ) from None
                except PermissionError:
                    raise
                except (OSError, EOFError, paramiko.SSHException) as e:
                    raise TransportError(f"host {self.host}: cannot read {target}: {e}") from e

        return self._with_retry(f"reading {target}", op)

    # -- processes ---------------------------------------------------------------------

    def start_detached(
        self, argv: list[str], *, log: str, cwd: str, env: dict[str, str] | None = None
    ) -> Started:
        log_path = self.resolve(log)
        cwd_path = self.resolve(cwd)
        script = detached_command_line(list(argv), log=log_path, cwd=cwd_path, env=env)
        code, out, err, timed_out = self._exec(script, 30.0)
        text = out.decode(errors="replace")
        lines = text.splitlines()
        if timed_out or code != 0 or not lines or not lines[0].strip().isdigit():
            why = "timed out" if timed_out else f"exit {code}"
            raise TransportError(
                f"host {self.host}: starting {argv[0]!r} in {cwd_path} failed ({why}): "
                f"{err.decode(errors='replace').strip()[-500:] or text.strip()[-500:]}. "
                "Fix: check that the directory exists and the log directory is writable."
            )
        pid = int(lines[0])
        st = parse_stat("\n".join(lines[1:])) if len(lines) > 1 else None
        ticks = st.start_ticks if st is not None and st.pid == pid else 0
        return Started(pid=pid, pgid=pid, start_ticks=ticks, log=log_path)

    def _stat(self, pid: int) -> ProcStat | None:
        out = self._snippet(
            f"cat /proc/{int(pid)}/stat 2>/dev/null; exit 0", f"reading the state of {pid}"
        )
        return parse_stat(out) if out.strip() else None

    def _group(self, pgid: int) -> tuple[ProcStat | None, list[ProcStat]]:
        """(the process numbered `pgid` if any, the members of process group `pgid`)."""
        out = self._snippet(group_stats_snippet(pgid), f"listing process group {pgid}")
        leader, members = None, []
        for line in out.splitlines():
            if line.startswith("L "):
                leader = parse_stat(line[2:])
            elif (st := parse_stat(line)) is not None and st.pgid == int(pgid):
                members.append(st)
        return leader, members

    def alive(self, pid: int, *, start_ticks: int | None = None) -> bool:
        st = self._stat(pid)
        if st is None or st.gone:
            return False
        return start_ticks is None or st.start_ticks == start_ticks

    def group_alive(self, pgid: int) -> list[int]:
        return sorted(s.pid for s in self._group(pgid)[1] if not s.gone)

    def signal_group(self, pgid: int, sig: int, *, start_ticks: int | None = None) -> bool:
        """Signal the group unless it can no longer be ours (same rules as LocalTransport:
        a live PID with other start_ticks means our group is gone; with the leader reaped,
        every member must be in session `pgid` and no older than our leader)."""
        pgid = int(pgid)
        leader, members = self._group(pgid)
        live = [s for s in members if not s.gone]
        if leader is not None:
            if start_ticks is not None and leader.start_ticks != start_ticks:
                return False
            if leader.gone and not live:
                return False
        else:
            if not live:
                return False
            if start_ticks is not None and any(
                s.sid != pgid or s.start_ticks < start_ticks for s in live
            ):
                return False
        out = self._snippet(
            f"kill -{int(sig)} -{pgid} 2>/dev/null && echo sent || echo gone; exit 0",
            f"signalling process group {pgid}",
        )
        return out.strip() == "sent"

    def ports_listening(self, ports: list[int]) -> list[int]:
        out = self._snippet(
            "awk '$4 == \"0A\" { print $2 }' /proc/net/tcp /proc/net/tcp6 2>/dev/null; exit 0",
            "listing listening ports",
        )
        listening = set()
        for local in out.split():
            try:
                listening.add(int(local.rsplit(":", 1)[1], 16))
            except (IndexError, ValueError):
                continue
        return [p for p in ports if p in listening]

    def close(self) -> None:
        """Close the connection (a later operation opens a new one); detached processes keep
        running."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


class _Unstarted(Exception):
    """The link was found dead before an operation reached the host: safe to retry."""
