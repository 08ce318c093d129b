"""The SSH transport, split by concern: `commands` (quoted command lines and snippets),
`config` (profile fields over ~/.ssh/config, jump hosts), `hostkeys` (verification),
`connect` (one connection through jump hosts), `timed` (exec with a deadline), `sftp` (files)
and `transport` (SSHTransport: pooling, reconnects, process control).

`SSHTransport` is imported on first use: the pure `commands` module is also what the container
transport sends (kvpd.exec.containers.transport), and importing it must not load paramiko."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvpd.exec.ssh.transport import SSHTransport

__all__ = ["SSHTransport"]


def __getattr__(name: str) -> Any:
    if name == "SSHTransport":
        from kvpd.exec.ssh.transport import SSHTransport

        return SSHTransport
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
