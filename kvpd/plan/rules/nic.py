"""The network interface of hosts an engine instance spans (pure).

An instance whose DP ranks run on several hosts talks between them over Gloo and HCCL, which
pick their interface from GLOO_SOCKET_IFNAME / HCCL_SOCKET_IFNAME (TP_SOCKET_IFNAME): unset,
Gloo falls back to loopback or the first interface, and the ranks never meet. kvpd renders them
from `hosts.<name>.nic`; it assumes no name (eth0 is one naming scheme among several), so where
an instance spans hosts the profile must give it.
"""

from __future__ import annotations

from kvpd.plan.rules.base import Checker
from kvpd.profile.schema import ASCEND

IFNAME_ENV = ("GLOO_SOCKET_IFNAME", "HCCL_SOCKET_IFNAME")


def rule_nic(c: Checker) -> None:
    if c.layout.problems:
        return
    for gf in c.gfacts():
        spans: dict[int, set[str]] = {}
        for ep in c.layout.procs:
            if ep.role == gf.role:
                spans.setdefault(ep.instance, set()).add(ep.host)
        multi = sorted({h for hosts in spans.values() if len(hosts) > 1 for h in hosts})
        if not multi or all(k in gf.env for k in IFNAME_ENV):
            continue
        for h in multi:
            host = c.p.hosts[h]
            if host.nic is None and c.f.hardware(h) in ASCEND:
                ip = host.ip or host.address
                c.err(
                    ("hosts", h, "nic"),
                    f"{gf.role} instances span {', '.join(multi)}; their DP ranks reach each "
                    "other over Gloo and HCCL on the interface GLOO/TP/HCCL_SOCKET_IFNAME name "
                    f"(rendered from nic), but '{h}' has no nic and kvpd does not guess one. "
                    f"Set hosts.{h}.nic to the interface of {ip} (`ip -o addr | grep {ip}`).",
                    on_hardware=True,
                )
