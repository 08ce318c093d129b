"""The port ledger (every listening port, hidden ranges included) and the proxy."""

from __future__ import annotations

from kvpd.plan.processes import Proc, proxy_flow
from kvpd.plan.rules.base import Checker, Path_


def rule_proxy(c: Checker) -> None:
    px = c.p.proxy
    if px is None:
        return
    bind = px.bind
    if proxy_flow(c.p) == "layerwise" and bind in ("0.0.0.0", "::", "0:0:0:0:0:0:0:0"):
        c.err(
            ("proxy", "bind"),
            "the layerwise proxy must listen on an address decoders can "
            "reach (they call <proxy>/v1/metaserver); 0.0.0.0 is not one. Leave `bind` unset "
            "to use the proxy host's address.",
        )
    if px.impl == "vllm-ascend" and proxy_flow(c.p) == "mixed":
        c.err(
            ("proxy", "impl"),
            "vLLM-Ascend's example proxies need prefill and decode groups; "
            "for `mixed:` engines use impl: kvpd (it balances over them).",
        )
    if px.impl == "vllm-ascend" and px.script is None:
        c.warn(
            ("proxy", "script"),
            "path of vLLM-Ascend's example proxy not set; assuming the "
            "repository's examples/disaggregated_prefill_v1/ relative to the run directory.",
        )


def rule_ports(c: Checker) -> None:
    seen: dict[tuple[str, int], str] = {}
    for proc in c.procs:
        for port, purpose in proc.ports:
            if port > 65535:
                c.err(
                    _proc_path(proc),
                    f"{proc.name} needs port {port} ({purpose}), above 65535. "
                    "Lower its kv_port/port.",
                )
                continue
            key = (proc.host, port)
            owner = f"{proc.name} ({purpose})"
            if key in seen:
                c.err(
                    _proc_path(proc),
                    f"port {port} on host '{proc.host}' is used twice: "
                    f"{seen[key]} and {owner}. Move one of them (group `port`/`kv_port`).",
                )
            seen.setdefault(key, owner)


def _proc_path(proc: Proc) -> Path_:
    if proc.role in ("prefill", "decode", "mixed"):
        return (proc.role, "port")
    if proc.role == "metaservice":
        return ("kv", "memcache")
    if proc.role == "mooncake":
        return ("kv", "mooncake")
    return ("proxy", "port")
