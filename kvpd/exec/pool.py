"""Pick the transport for a host: local processes or SSH (imported lazily: paramiko is heavy)."""

from __future__ import annotations

import threading

from kvpd.errors import ProfileError
from kvpd.exec.transport import Transport
from kvpd.plan.value import HostSpec, Plan

KNOWN_TRANSPORTS = ("local", "ssh")


def open_transport(host: HostSpec, *, accept_unknown_host_key: bool = False) -> Transport:
    """A transport for `host` by its `transport` field ("local" or "ssh"); inside the host's
    container when it has one."""
    t = _host_transport(host, accept_unknown_host_key=accept_unknown_host_key)
    if host.container is not None:
        from kvpd.exec.containers.transport import ContainerTransport

        return ContainerTransport(t, host.container)
    return t


def _host_transport(host: HostSpec, *, accept_unknown_host_key: bool = False) -> Transport:
    if host.transport == "local":
        from kvpd.exec.local import LocalTransport

        return LocalTransport(host)
    if host.transport == "ssh":
        from kvpd.exec.ssh import SSHTransport

        return SSHTransport(host, accept_unknown_host_key=accept_unknown_host_key)
    raise ProfileError(
        f"host {host.name!r}: unknown transport {host.transport!r}. "
        f"Use one of: {', '.join(KNOWN_TRANSPORTS)}."
    )


class TransportPool:
    """Transports by host name: those given by the caller, plus ones opened on first use for
    hosts it did not supply (e.g. hosts of an older state). Closes only what it opened."""

    def __init__(
        self,
        hosts: tuple[HostSpec, ...] | list[HostSpec],
        given: dict[str, Transport] | None = None,
        *,
        accept_unknown_host_key: bool = False,
    ) -> None:
        self._hosts = {h.name: h for h in hosts}
        self._given = dict(given or {})
        self._opened: dict[str, Transport] = {}
        self._accept = accept_unknown_host_key
        self._lock = threading.Lock()
        self._host_locks: dict[str, threading.Lock] = {}

    def for_plan(self, plan: Plan) -> TransportPool:
        """The one way to `plan`'s hosts: this pool, told `plan`'s hosts (a host already known
        keeps its spec; a transport opens on first use and closes with the pool)."""
        for h in plan.hosts:
            self._hosts.setdefault(h.name, h)
        return self

    def host_transport(self, name: str) -> Transport:
        """`name`'s own transport: the host itself even when its processes run in a container
        (what lives in the login's home, such as the lease, and the runtime's commands)."""
        from kvpd.exec.containers.life import host_side

        return host_side(self[name])

    def __getitem__(self, name: str) -> Transport:
        if name in self._given:
            return self._given[name]
        if name not in self._hosts:
            raise KeyError(f"no transport and no host spec for host {name!r}")
        # One lock per host, so connecting to several hosts runs in parallel.
        with self._lock:
            host_lock = self._host_locks.setdefault(name, threading.Lock())
        with host_lock:
            if name not in self._opened:
                t = open_transport(self._hosts[name], accept_unknown_host_key=self._accept)
                with self._lock:
                    self._opened[name] = t
            return self._opened[name]

    def close(self) -> None:
        with self._lock:
            opened = list(self._opened.values())
            self._opened.clear()
        for t in opened:
            t.close()
