"""The SSH transport, split by concern: `commands` (quoted command lines and snippets),
`config` (profile fields over ~/.ssh/config, jump hosts), `hostkeys` (verification),
`connect` (one connection through jump hosts), `timed` (exec with a deadline), `sftp` (files)
and `transport` (SSHTransport: pooling, reconnects, process control)."""

from kvpd.exec.ssh.transport import SSHTransport

__all__ = ["SSHTransport"]
