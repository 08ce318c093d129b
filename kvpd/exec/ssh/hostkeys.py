"""Host key verification: known_hosts is always checked; an unknown key is refused unless the
user passed --accept-new-host-keys, a changed key always (ssh_config's StrictHostKeyChecking is
not consulted: kvpd never turns verification off)."""

from __future__ import annotations

import base64
import hashlib
import os
import threading

import paramiko

from kvpd.errors import HostKeyError


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


class HostKeyPolicy(paramiko.MissingHostKeyPolicy):
    """Unknown key: refuse with the fingerprint and how to accept it, or (with the explicit
    flag) record it in known_hosts. A changed key never reaches this policy: paramiko raises
    BadHostKeyException, which is always refused (see `changed_key_error`)."""

    def __init__(self, label: str, known_hosts: str, accept: bool) -> None:
        self.label = label
        self.known_hosts = known_hosts
        self.accept = accept

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
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


def verify_with(
    client: paramiko.SSHClient, known_hosts: str, label: str, *, accept_unknown: bool
) -> None:
    """Make `client` check host keys against `known_hosts` with kvpd's policy."""
    if os.path.exists(known_hosts) and not os.path.isfile(known_hosts):
        # /dev/null (a common ssh_config UserKnownHostsFile) records nothing: with
        # --accept-new-host-keys every connection would trust whatever key a host offers.
        raise HostKeyError(
            f"{label}: known_hosts {known_hosts} is not a regular file (ssh_config's "
            "UserKnownHostsFile or the host's known_hosts setting), so no host key can be "
            "checked or recorded"
            + (
                " and --accept-new-host-keys would accept any key on every connection"
                if accept_unknown
                else ""
            )  # fmt: skip
            + ". Fix: set the host's known_hosts (or UserKnownHostsFile) to a file, e.g. "
            "~/.ssh/known_hosts."
        )
    if os.path.exists(known_hosts):
        try:
            client.get_host_keys().load(known_hosts)
        except (OSError, paramiko.SSHException) as e:
            raise HostKeyError(
                f"{label}: cannot read known_hosts {known_hosts}: {e}. Fix the file "
                "or point the host's known_hosts setting at a valid one."
            ) from e
    client.set_missing_host_key_policy(HostKeyPolicy(label, known_hosts, accept_unknown))


def changed_key_error(
    e: paramiko.BadHostKeyException, label: str, known_hosts: str, address: str, port: int
) -> HostKeyError:
    return HostKeyError(
        f"{label}: HOST KEY CHANGED, connection refused. known_hosts "
        f"{known_hosts} has {e.expected_key.get_name()} "
        f"{fingerprint(e.expected_key)}, the host offered {e.key.get_name()} "
        f"{fingerprint(e.key)}. This can be an attack or a reinstalled host. If you "
        f"have verified the new key, remove the old one with `ssh-keygen -f "
        f"{known_hosts} -R {known_hosts_name(address, port)}` and "
        "connect again with --accept-new-host-keys."
    )
