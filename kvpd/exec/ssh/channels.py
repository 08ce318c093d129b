"""Ports on a host reached through its SSH connection: a direct-tcpip channel from the host's
sshd to the address the process listens on (as the host sees it), so the controller needs to
reach nothing but sshd. Each way an open fails gets its own error and fix."""

from __future__ import annotations

import logging

import paramiko

from kvpd.exec.channel_errors import refusal
from kvpd.exec.ssh.connect import LINK_ERRORS, Connection, Unstarted
from kvpd.exec.transport import ChannelError
from kvpd.profile.types import is_loopback


class _ReportedByKvpd(logging.Filter):
    """paramiko logs each refused channel open at ERROR ("Secsh channel 3 open FAILED: ..."),
    which Python prints on stderr when the program configured no logging: a status or a health
    wait would print it on every probe. kvpd reports those failures itself, with their fix."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "open FAILED" not in record.getMessage()


logging.getLogger("paramiko.transport").addFilter(_ReportedByKvpd())


def open_to(
    conn: Connection, host: str, user: str, address: str, port: int, timeout_s: float, *,
    own: tuple[str, ...] = (),
) -> paramiko.Channel:  # fmt: skip
    """A channel to `address:port` as seen from `host` (whose own addresses are `own`, besides
    loopback); Unstarted when the link is gone, ChannelError when the host's sshd refuses or
    the port does."""
    transport = conn.client.get_transport()
    if transport is None or not transport.is_active():
        raise Unstarted() from EOFError("connection closed")
    try:
        chan = transport.open_channel(
            "direct-tcpip", (address, port), ("127.0.0.1", 0), timeout=timeout_s
        )
    except paramiko.ChannelException as e:
        mine = is_loopback(address) or address in own
        raise refusal(host, user, address, port, e.code, e.text, own=mine) from None
    except paramiko.SSHException as e:
        if not transport.is_active():
            raise Unstarted() from e
        raise ChannelError(
            "timeout",
            f"no channel within {timeout_s:g}s",
            f"host {host}: its sshd did not open a channel to {address}:{port} within "
            f"{timeout_s:g}s ({e}). Fix: check that {address} is the host's own address "
            "(it may not reach it) and that sshd is not overloaded.",
        ) from None
    except LINK_ERRORS as e:
        raise Unstarted() from e
    chan.setblocking(True)
    return chan
