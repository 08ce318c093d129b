"""Preflight of the one way in: on each host, one channel to a port of the host itself must
open, since health probes, the canary, /metrics and the proxy's admin API all go through the
host's transport (over SSH a direct-tcpip channel, which sshd may forbid)."""

from __future__ import annotations

from collections.abc import Callable

from kvpd.exec.fanout import Fanout
from kvpd.exec.preflight.checks import Check
from kvpd.exec.transport import ChannelError, HttpRequest, Transport

# Loopback port 1 (tcpmux) has no listener on any host kvpd serves from: a refused connect
# proves the channel opened and reached the host's own network stack, without touching any
# service. A listener there would answer something, which proves the same.
_PORT = 1
NAME = "ports via transport"


def check_host(host: str, t: Transport) -> Check:
    """Whether `t` carries a connection to a port of its host."""
    try:
        t.http(HttpRequest("GET", "127.0.0.1", _PORT, "/", timeout_s=10))
    except ChannelError as e:
        if e.kind == "forbidden":  # the fix as the transport words it (with the login user)
            fix = str(e).partition("Fix: ")[2] or "allow TCP forwarding in the host's sshd"
            return Check(host, NAME, False, e.detail, fix.rstrip("."))
        if e.kind == "unreachable":
            return Check(host, NAME, False, e.detail, "check the host is up and reachable")
        if e.kind == "timeout":  # sshd took no decision: every probe through it would wait too
            return Check(host, NAME, False, e.detail,
                         "check the host's sshd (overloaded, or MaxSessions reached?)")  # fmt: skip
    return Check(host, NAME, True, "a channel to the host's own ports opens")


def channel_checks(
    hosts: list[str], transports: Callable[[str], Transport], fan: Fanout
) -> list[Check]:
    """One channel check per host, in parallel."""
    outcomes = fan.each(lambda h: check_host(h, transports(h)), hosts, key=str)
    return [
        o.value if o.value is not None else Check(h, NAME, False, str(o.error), "")
        for h, o in outcomes.items()
    ]
