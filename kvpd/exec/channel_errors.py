"""The words for each way an exchange with a port on a host fails through its SSH
connection: one wording for the SSH transport and the fake that stands in for it."""

from __future__ import annotations

from kvpd.exec.transport import ChannelError

# RFC 4254 section 5.1 reason codes (paramiko.common names them OPEN_FAILED_*).
PROHIBITED = 1
CONNECT_FAILED = 2


def refusal(
    host: str, user: str, address: str, port: int, code: int, text: str, *, own: bool
) -> ChannelError:
    """The error for a channel the host's sshd would not open (`code`, `text` from its
    SSH_MSG_CHANNEL_OPEN_FAILURE). OpenSSH says "Connect failed" for every failed connect,
    so a failure to one of the host's `own` addresses is the port refusing (the host always
    routes to itself), and to another address either refused or not routed."""
    said = (text or "").strip()
    if code == PROHIBITED:
        return ChannelError(
            "forbidden",
            f"channel refused by {host}'s sshd (AllowTcpForwarding no?)",
            f"host {host}: channel refused by {host}'s sshd (AllowTcpForwarding no?): "
            f"kvpd reaches the ports of cluster processes (health, /metrics, the proxy's admin "
            f"API) through the SSH connection, and this sshd forbids it ({said or 'prohibited'})"
            f". Fix: allow TCP forwarding for {user} in {host}'s sshd_config "
            "(`AllowTcpForwarding local`, no `DisableForwarding yes`, `PermitOpen any`) and "
            "reload sshd.",
        )
    if code == CONNECT_FAILED and own:
        return ChannelError(
            "refused",
            f"port {port} refused (the SSH channel to {host} opened)",
            f"host {host}: the SSH channel to {host} opened, port {port} refused: nothing "
            f"listens on {address}:{port} as seen from {host}. Fix: check that the process "
            "runs and listens on that address (`kvpd status`, `kvpd logs NAME`).",
        )
    why = said or f"open failure code {code}"
    if code == CONNECT_FAILED:
        why += ": refused, or no route from there (sshd does not say which)"
    return ChannelError(
        "unreachable",
        f"{host} cannot connect to {address}:{port}",
        f"host {host}: the SSH channel to {host} opened, but {host} cannot connect to "
        f"{address}:{port} ({why}). Fix: check that the process runs, and that {address} "
        f"is an address of {host} (its `address` in the profile) or one {host} routes to.",
    )


def unreachable(host: str, error: Exception) -> ChannelError:
    """The error for a host whose SSH connection could not be had at all."""
    return ChannelError("unreachable", f"{host} unreachable", f"{host} unreachable: {error}")
