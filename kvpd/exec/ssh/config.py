"""Where and how to connect to a host: the profile's fields over the user's ~/.ssh/config.

The host's `address` is looked up in ssh_config the way `ssh ADDRESS` would (Host patterns);
HostName, User, Port, IdentityFile, UserKnownHostsFile and ProxyJump fill what the profile or
inventory leaves unset; a jump host's key is its `jump_key`, else its IdentityFile, else the
target's key. A profile `port` of 22 (the schema default) counts as unset. Each jump
host is looked up the same way. Nothing here connects.
"""

from __future__ import annotations

import getpass
import os
import re
from dataclasses import dataclass

import paramiko

from kvpd.errors import PlanError, TransportError
from kvpd.plan.value import HostSpec

DEFAULT_SSH_CONFIG = "~/.ssh/config"
# Points kvpd at another ssh_config (tests, or a team's shared file); "none" reads none.
SSH_CONFIG_ENV = "KVPD_SSH_CONFIG"
DEFAULT_PORT = 22


@dataclass(frozen=True)
class Hop:
    """One SSH connection to make: who, where, with which keys (empty: agent and ~/.ssh/id_*)."""

    user: str
    address: str
    port: int
    keys: tuple[str, ...] = ()


@dataclass(frozen=True)
class JumpSpec:
    """One entry of a ProxyJump list as written (unset fields come from ssh_config)."""

    user: str | None
    address: str
    port: int | None


@dataclass(frozen=True)
class Route:
    """The target and the jump hosts to tunnel through, in order."""

    target: Hop
    jumps: tuple[Hop, ...]
    known_hosts: str


def parse_jump(spec: str | None) -> list[JumpSpec]:
    """ProxyJump spec `[user@]host[:port][,...]` (IPv6 as `[addr]:port`) into hops."""
    hops: list[JumpSpec] = []
    for part in (spec or "").split(","):
        part = part.strip()
        if not part:
            continue
        user, _, hostport = part.rpartition("@")
        m = re.fullmatch(r"\[([^\]]+)\](?::(\d+))?|([^:\[\]]+)(?::(\d+))?", hostport)
        if not m:
            raise PlanError(f"invalid jump host {part!r}: expected user@host:port")
        port = m.group(2) or m.group(4)
        hops.append(JumpSpec(user or None, m.group(1) or m.group(3), int(port) if port else None))
    return hops


def load_ssh_config(path: str | None = None) -> paramiko.SSHConfig:
    """The user's ssh_config (`path`, else $KVPD_SSH_CONFIG, else ~/.ssh/config); empty when
    the file does not exist."""
    path = path or os.environ.get(SSH_CONFIG_ENV) or DEFAULT_SSH_CONFIG
    if path == "none":
        return paramiko.SSHConfig()
    full = os.path.expanduser(path)
    if not os.path.exists(full):
        return paramiko.SSHConfig()
    try:
        return paramiko.SSHConfig.from_path(full)
    except (OSError, ValueError, paramiko.SSHException) as e:
        raise TransportError(
            f"cannot read ssh_config {full}: {e}. Fix the file, or set {SSH_CONFIG_ENV}=none "
            "to connect with the profile's fields only."
        ) from e


def _identity_files(options: dict[str, object]) -> tuple[str, ...]:
    # Like ssh, identity files named by ssh_config that do not exist are skipped.
    files = options.get("identityfile") or []
    assert isinstance(files, list)  # paramiko collects IdentityFile lines in a list
    return tuple(os.path.expanduser(p) for p in files if os.path.exists(os.path.expanduser(p)))


def _lookup(config: paramiko.SSHConfig, name: str) -> dict[str, object]:
    return dict(config.lookup(name))


def _port(explicit: int | None, options: dict[str, object], name: str) -> int:
    if explicit is not None and explicit != DEFAULT_PORT:
        return explicit
    raw = str(options.get("port", DEFAULT_PORT))
    if not raw.isdigit() or not 1 <= int(raw) <= 65535:
        raise TransportError(f"ssh_config: host {name}: invalid Port {raw!r}")
    return int(raw)


def route(host: HostSpec, config: paramiko.SSHConfig) -> Route:
    """Resolve `host` through `config`; the profile's fields win over ssh_config's."""
    opts = _lookup(config, host.address)
    user = host.user or str(opts.get("user") or getpass.getuser())
    key = (os.path.expanduser(host.key),) if host.key else ()
    target = Hop(
        user=user,
        address=str(opts.get("hostname") or host.address),
        port=_port(host.port, opts, host.address),
        keys=key or _identity_files(opts),
    )
    known = host.known_hosts or str(opts.get("userknownhostsfile") or "").split(" ")[0]
    jump = host.jump or str(opts.get("proxyjump") or "")
    jumps = []
    # A bastion often takes a personal key: its own jump_key, else ssh_config's IdentityFile
    # for it, and only then the target's key.
    jump_key = (os.path.expanduser(host.jump_key),) if host.jump_key else ()
    for j in parse_jump(None if jump.lower() == "none" else jump):
        jo = _lookup(config, j.address)
        jumps.append(
            Hop(
                user=j.user or str(jo.get("user") or user),
                address=str(jo.get("hostname") or j.address),
                port=_port(j.port, jo, j.address),
                keys=jump_key or _identity_files(jo) or key,
            )
        )
    return Route(target, tuple(jumps), os.path.expanduser(known or "~/.ssh/known_hosts"))
