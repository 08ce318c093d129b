"""Jump-host connections shared by every host behind them: one SSH connection to a bastion
carries the channels of all the hosts kvpd reaches through it (as OpenSSH's ControlMaster
does), so `up` of N hosts does N + 1 handshakes through a bastion, not 2N. A client is closed
when the last connection using it is."""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable

import paramiko

_LOCK = threading.Lock()
_CHAIN_LOCKS: dict[Hashable, threading.Lock] = {}
_SHARED: dict[Hashable, paramiko.SSHClient] = {}
_USERS: dict[int, int] = {}  # id(client) -> connections using it


def _alive(client: paramiko.SSHClient) -> bool:
    t = client.get_transport()
    return t is not None and t.is_active()


def acquire(key: Hashable, make: Callable[[], paramiko.SSHClient]) -> paramiko.SSHClient:
    """The live shared client for `key` (a jump chain and how it is verified), connected by
    `make()` when there is none; one connect per key at a time, others wait for it."""
    with _LOCK:
        chain_lock = _CHAIN_LOCKS.setdefault(key, threading.Lock())
    with chain_lock:
        with _LOCK:
            client = _SHARED.get(key)
        if client is None or not _alive(client):
            client = make()
            with _LOCK:
                _SHARED[key] = client
        with _LOCK:
            _USERS[id(client)] = _USERS.get(id(client), 0) + 1
        return client


def release(key: Hashable, client: paramiko.SSHClient) -> None:
    """One connection no longer uses `client`; the last one closes it."""
    with _LOCK:
        left = _USERS.get(id(client), 1) - 1
        if left > 0:
            _USERS[id(client)] = left
            return
        _USERS.pop(id(client), None)
        if _SHARED.get(key) is client:
            del _SHARED[key]
    try:
        client.close()
    except Exception:  # noqa: BLE001 - closing a dead connection may raise anything; it is gone
        pass
