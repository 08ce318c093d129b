"""Opening one SSH connection along a Route: jump hosts tunnelled through direct-tcpip channels,
TCP_NODELAY on both ends of every hop, verified host keys, and an error a user can act on for
every way a connect fails."""

from __future__ import annotations

import socket
from collections.abc import Hashable

import paramiko

from kvpd.errors import HostKeyError, TransportError
from kvpd.exec.ssh import jumps as shared_jumps
from kvpd.exec.ssh.config import Hop, Route
from kvpd.exec.ssh.hostkeys import changed_key_error, verify_with
from kvpd.exec.ssh.timed import drive

# Network-level failures while talking to a host (a dropped connection shows up as any of them).
LINK_ERRORS = (paramiko.SSHException, EOFError, OSError)


class Unstarted(Exception):
    """The link was found dead before an operation reached the host: safe to retry."""


class Connection:
    """A connected client, the shared jump-host clients it tunnels through, and its SFTP."""

    def __init__(
        self,
        client: paramiko.SSHClient,
        jumps: list[tuple[Hashable, paramiko.SSHClient]] | None = None,
    ) -> None:
        self.client = client
        self.jumps = list(jumps or [])
        self.sftp: paramiko.SFTPClient | None = None
        # The login directory, as the first session printed it (None if it could not).
        self.login_dir: str | None = None

    @property
    def active(self) -> bool:
        t = self.client.get_transport()
        return t is not None and t.is_active()

    def session(self, timeout_s: float) -> paramiko.Channel:
        """A new channel; Unstarted if the link is gone."""
        try:
            transport = self.client.get_transport()
            if transport is None or not transport.is_active():
                raise EOFError("connection closed")
            return transport.open_session(timeout=timeout_s)
        except LINK_ERRORS as e:
            raise Unstarted() from e

    def open_sftp(self) -> paramiko.SFTPClient:
        """The connection's SFTP session (opened once); Unstarted if the link is gone."""
        if not self.active:
            raise Unstarted() from EOFError("connection closed")
        if self.sftp is None:
            try:
                self.sftp = self.client.open_sftp()
            except LINK_ERRORS as e:
                raise Unstarted() from e
        return self.sftp

    def close(self) -> None:
        try:
            self.client.close()
        except Exception:  # noqa: BLE001 - closing a dead connection may raise anything; it is gone
            pass
        for key, c in reversed(self.jumps):
            shared_jumps.release(key, c)
        self.jumps = []


def connect(
    route: Route, name: str, *, accept_unknown_host_key: bool, timeout_s: float
) -> Connection:
    """Connect to `route.target` (host `name`) through its jump hosts, whose connections are
    shared with every other host behind the same chain (kvpd/exec/ssh/jumps.py)."""
    held: list[tuple[Hashable, paramiko.SSHClient]] = []
    hops = list(route.jumps)
    prev: paramiko.SSHClient | None = None
    try:
        for i, hop in enumerate(hops):
            chain: Hashable = (tuple(hops[: i + 1]), route.known_hosts, accept_unknown_host_key)

            def make(
                prev: paramiko.SSHClient | None = prev, hop: Hop = hop, i: int = i
            ) -> paramiko.SSHClient:
                sock = None if prev is None else _channel(prev, hops[i - 1], hop, name, timeout_s)
                label = f"jump host {hop.address} (for {name})"
                c = _client(hop, sock, label, route.known_hosts, accept_unknown_host_key,
                            timeout_s)  # fmt: skip
                first_session(c, "true", timeout_s, wait=False)
                return c

            prev = shared_jumps.acquire(chain, make)
            held.append((chain, prev))
        sock = None if prev is None else _channel(prev, hops[-1], route.target, name, timeout_s)
        client = _client(
            route.target,
            sock,
            f"host {name}",
            route.known_hosts,
            accept_unknown_host_key,
            timeout_s,
        )
        conn = Connection(client, held)
        conn.login_dir = first_session(client, "pwd", timeout_s)
    except BaseException:
        for done, c in reversed(held):
            shared_jumps.release(done, c)
        raise
    return conn


def first_session(
    client: paramiko.SSHClient, command: str, timeout_s: float, *, wait: bool = True
) -> str | None:
    """Run `command` in one session right after connecting. OpenSSH's sshd sets TCP_NODELAY on
    its end of a connection when the connection's first session starts (never before, never
    later): a connection that carries only direct-tcpip channels (a bastion's, or a host's that
    only serves probes) keeps Nagle's algorithm on the server side, and every small answer
    behind an unacknowledged one waits for the peer's delayed ACK (~40 ms per exchange through
    a bastion). A host that refuses sessions (a jump-only account) just stays slower. The
    command's first stdout line is returned (`pwd` gives the login directory), None when it
    failed. `wait=False` (jump hosts, whose account may run a ForceCommand that never ends):
    sshd has set the option once it accepted the command, so the session is closed then."""
    try:
        transport = client.get_transport()
        if transport is None:
            return None
        chan = transport.open_session(timeout=timeout_s)
        try:
            if not wait:
                chan.exec_command(command)  # returns once sshd answered the request
                return None
            code, out, _, timed_out = drive(chan, command, min(timeout_s, 10.0))
        finally:
            chan.close()
    except LINK_ERRORS:
        return None  # refused or failed: the connection works, only without sshd's TCP_NODELAY
    if code != 0 or timed_out:
        return None
    return out.decode(errors="replace").partition("\n")[0].strip() or None


def _channel(
    via: paramiko.SSHClient, hop: Hop, nxt: Hop, name: str, timeout_s: float
) -> paramiko.Channel:
    """A direct-tcpip channel from jump host `hop` (connected as `via`) to `nxt`'s sshd."""
    try:
        transport = via.get_transport()
        if transport is None:
            raise EOFError("connection closed")
        return transport.open_channel(
            "direct-tcpip", (nxt.address, nxt.port), ("127.0.0.1", 0), timeout=timeout_s
        )
    except LINK_ERRORS as e:
        raise TransportError(
            f"host {name}: jump host {hop.address} cannot reach "
            f"{nxt.address}:{nxt.port}: {e or type(e).__name__}. Fix: check the "
            "address and that the jump host allows TCP forwarding "
            "(AllowTcpForwarding in its sshd_config)."
        ) from e


def _client(
    hop: Hop,
    sock: paramiko.Channel | socket.socket | None,
    label: str,
    known_hosts: str,
    accept: bool,
    t: float,
) -> paramiko.SSHClient:
    where = f"{hop.user}@{hop.address}:{hop.port}"
    client = paramiko.SSHClient()
    verify_with(client, known_hosts, f"{label} ({where})", accept_unknown=accept)
    try:
        if sock is None:
            sock = socket.create_connection((hop.address, hop.port), timeout=t)
            # Without it, Nagle's algorithm and delayed ACKs add ~40 ms to every exchange.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        client.connect(
            hop.address,
            port=hop.port,
            username=hop.user,
            # paramiko takes a list too (its stubs say str only)
            key_filename=list(hop.keys) or None,  # type: ignore[arg-type]
            look_for_keys=not hop.keys,
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
        err = _connect_error(e, f"{label} ({where})", hop, known_hosts, t)
        if err is None:
            raise
        raise err from e
    transport = client.get_transport()
    if transport is not None:
        transport.set_keepalive(15)  # notices a dead peer between operations
    return client


def _connect_error(
    e: Exception, label: str, hop: Hop, known_hosts: str, t: float
) -> Exception | None:
    """The user-facing error for a failed connect, or None to re-raise `e` as is."""
    if isinstance(e, HostKeyError):
        return None
    if isinstance(e, paramiko.BadHostKeyException):
        return changed_key_error(e, label, known_hosts, hop.address, hop.port)
    if isinstance(e, paramiko.AuthenticationException):
        how = f"key {', '.join(hop.keys)}" if hop.keys else "ssh-agent and ~/.ssh/id_* keys"
        return TransportError(
            f"{label}: authentication failed with {how}: {e}. Fix: put the "
            f"public key in ~{hop.user}/.ssh/authorized_keys on the host, set the host's "
            "`key`, or load a passphrase-protected key into ssh-agent (ssh-add)."
        )
    if isinstance(e, TimeoutError):
        return TransportError(
            f"{label}: timed out after {t:g}s connecting. Fix: check the "
            "address and port, that the host is up, and firewalls on the path."
        )
    if isinstance(e, LINK_ERRORS):
        if "authentication" in str(e).lower():  # e.g. no key and no agent at all
            return TransportError(
                f"{label}: {e}. Fix: set the host's `key` or start ssh-agent "
                "with a key loaded (ssh-add)."
            )
        return TransportError(
            f"{label}: cannot connect: {e or type(e).__name__}. Fix: check the "
            "address and port and that sshd runs on the host."
        )
    return None
