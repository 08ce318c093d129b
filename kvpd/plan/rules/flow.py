"""Where the proxy runs and which flow its script speaks (pure).

In the layerwise (decode-first) flow every decoder calls `<proxy>/v1/metaserver` at the proxy
host's address: a loopback address there is the decoder's own machine. vLLM-Ascend ships one
example proxy per flow; its prefill-first script never starts SfaRemoteD2H's transfer.
"""

from __future__ import annotations

import posixpath

from kvpd.plan.rules.base import Checker
from kvpd.profile.types import is_loopback

PREFILL_FIRST_SCRIPT = "load_balance_proxy_server_example.py"


def rule_proxy_placement(c: Checker) -> None:
    px = c.p.proxy
    if px is None or px.host not in c.p.hosts or c.f.proxy_flow != "layerwise":
        return
    d = c.f.group("decode")
    address = c.p.hosts[px.host].address
    remote = sorted(h for h in (d.group.hosts if d else []) if h != px.host)
    if px.bind is None and is_loopback(address) and remote:
        c.err(
            ("hosts", px.host, "address"),
            f"the layerwise proxy runs on '{px.host}' at {address}, a loopback address, but "
            f"decode on {', '.join(remote)} calls <proxy>/v1/metaserver there (from those "
            f"hosts that address is themselves). Give hosts.{px.host}.address an address the "
            "decode hosts reach, or run the proxy on a decode host.",
        )


def rule_proxy_script(c: Checker) -> None:
    px = c.p.proxy
    if px is None or px.impl != "vllm-ascend" or px.script is None:
        return
    d = c.f.group("decode")
    if d is None or "sfa_d2h" not in d.connectors:
        return
    if posixpath.basename(px.script) == PREFILL_FIRST_SCRIPT:
        c.err(
            ("proxy", "script"),
            f"{px.script} is vLLM-Ascend's prefill-first proxy, which never starts "
            "SfaRemoteD2H's transfer (decode must ask <proxy>/v1/metaserver for the prefill). "
            "Use load_balance_proxy_layerwise_server_example.py, or leave proxy.script unset.",
        )
