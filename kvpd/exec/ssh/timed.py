"""Running one command on a channel with a deadline, collecting stdout and stderr."""

from __future__ import annotations

import select
import time

import paramiko

# The exit code a timed-out command reports (as coreutils' `timeout` does).
TIMED_OUT = 124


def drive(chan: paramiko.Channel, command: str, timeout_s: float) -> tuple[int, bytes, bytes, bool]:
    """Run `command` on `chan`: (exit code, stdout, stderr, timed out). The remote command is
    not stopped on timeout; the caller decides what to do about it."""
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
        if chan.closed and not chan.eof_received:
            # paramiko closes every channel of a connection that died, with no EOF and no exit
            # status: waiting on would only reach the deadline, and the command's fate is
            # unknown (a link error, as the caller's other lost-link cases are).
            raise EOFError("the connection closed while the command ran")
        left = deadline - time.monotonic()
        if chan.eof_received and not chan.recv_ready() and not chan.recv_stderr_ready():
            if chan.status_event.wait(max(left, 0)):
                return chan.recv_exit_status(), b"".join(out), b"".join(err), False
            return TIMED_OUT, b"".join(out), b"".join(err), True
        if left <= 0:
            return TIMED_OUT, b"".join(out), b"".join(err), True
        # The channel's fileno becomes readable on stdout or stderr data and on EOF; the
        # cap only bounds how long a missed wake-up could delay us.
        select.select([chan], [], [], min(left, 0.2))
