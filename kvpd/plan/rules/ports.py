"""The port ledger (every listening port, hidden ranges included) and the proxy."""

from __future__ import annotations

import ipaddress

from kvpd.plan.processes import ProcessDraft
from kvpd.plan.proxyargs import set_routing, set_timeouts
from kvpd.plan.rules.base import Checker, Path_
from kvpd.profile.roles import ENGINE_ROLES, Role
from kvpd.profile.types import is_ip

WILDCARDS = ("0.0.0.0", "::", "0:0:0:0:0:0:0:0")
# Groups whose decode side needs the decode-first (layerwise) proxy flow.
LAYERWISE_DECODE = frozenset({"sfa_d2h", "mooncake_layerwise"})


def _client_key(c: Checker) -> None:
    """The proxy's two keys: the backend key (OPENAI_API_KEY) is sent to the engines for the
    proxy's clients, so it needs the client key that says who they are."""
    px = c.p.proxy
    assert px is not None
    if px.impl == "vllm-ascend" and px.client_key_file:
        c.err(("proxy", "client_key_file"),
              "vLLM-Ascend's example proxy cannot check a client key; use kvpd's proxy "
              "(impl: kvpd) or remove client_key_file.", on_hardware=True)  # fmt: skip
    if px.impl == "kvpd" and c.p.env.get("OPENAI_API_KEY") and not px.client_key_file:
        c.err(
            ("env", "OPENAI_API_KEY"),
            "OPENAI_API_KEY gives the proxy a key for the engines, which it would send for "
            "anyone who reaches it. Set proxy.client_key_file to a file (mode 0600, one line "
            "of at least 32 characters) with the key your clients send, or remove "
            "OPENAI_API_KEY to pass each client's own key to the engines (VLLM_API_KEY).",
        )


def rule_proxy(c: Checker) -> None:  # noqa: C901 — a flat checklist: one independent check per proxy setting
    px = c.p.proxy
    if px is None:
        return
    if px.impl == "vllm-ascend":  # a rehearsal runs kvpd's proxy instead: moot there
        for name in set_timeouts(px):
            c.err(
                ("proxy", name),
                "vLLM-Ascend's example proxy has no timeout options (it waits without limit); "
                f"remove proxy.{name} or use kvpd's proxy (impl: kvpd).",
                on_hardware=True,
            )
        for name in set_routing(px):
            c.err(
                ("proxy", name),
                "vLLM-Ascend's example proxy balances by load only and has no routing options; "
                f"remove proxy.{name} or use kvpd's proxy (impl: kvpd).",
                on_hardware=True,
            )
    _client_key(c)
    flow = c.f.proxy_flow
    d = c.f.group("decode")
    bind = px.bind
    if flow == "layerwise" and bind in WILDCARDS:
        c.err(
            ("proxy", "bind"),
            "the layerwise proxy must listen on an address decoders can "
            f"reach (they call <proxy>/v1/metaserver); {bind} is not one. Leave `bind` unset "
            "to use the proxy host's address.",
        )
    elif flow == "layerwise" and bind is not None and is_ip(bind):
        decode_hosts = set(d.group.hosts) if d is not None else set()
        if ipaddress.ip_address(bind).is_loopback and decode_hosts - {px.host}:
            c.err(
                ("proxy", "bind"),
                f"the layerwise proxy listens on {bind}, but decoders on other hosts call "
                "<proxy>/v1/metaserver. Leave `bind` unset to use the proxy host's address.",
            )
    if d is not None and "sfa_d2h" in d.connectors and flow == "prefill-first":
        c.err(
            ("proxy", "flow"),
            "SfaRemoteD2H deployments need the decode-first layerwise proxy (decode asks "
            "<proxy>/v1/metaserver for the prefill); prefill-first never starts the transfer. "
            "Set proxy.flow: layerwise (or auto).",
        )
    if flow == "layerwise" and d is not None and not LAYERWISE_DECODE & d.connectors:
        c.err(
            ("proxy", "flow"),
            f"the layerwise (decode-first) proxy works with SfaRemoteD2H or Mooncake "
            f"layerwise on decode; decode uses {', '.join(sorted(d.connectors)) or 'none'}. "
            "Set proxy.flow: prefill-first (or auto).",
        )
    if px.impl == "vllm-ascend" and flow == "mixed":
        c.err(
            ("proxy", "impl"),
            "vLLM-Ascend's example proxies need prefill and decode groups; "
            "for `mixed:` engines use impl: kvpd (it balances over them).",
        )
    if px.impl == "vllm-ascend" and px.script is None:
        c.warn(
            ("proxy", "script"),
            "path of vLLM-Ascend's example proxy not set; assuming the "
            "repository's examples/disaggregated_prefill_v1/ relative to the run directory. "
            "Set proxy.script to be explicit.",
        )


def port_field(proc: ProcessDraft, purpose: str) -> Path_:
    """The profile field that put `purpose`'s port into the ledger."""
    if proc.role in ENGINE_ROLES:
        if purpose == "http":
            return (proc.role, "port")
        if purpose == "data-parallel rpc":
            return (proc.role, "dp_rpc_port")
        return (proc.role, "kv_port")
    if proc.role == Role.METASERVICE:
        if "config store" in purpose:
            return ("kv", "memcache", "config_store_port")
        if "metrics" in purpose:
            return ("kv", "memcache", "metrics_port")
        return ("kv", "memcache", "port")
    if proc.role == Role.MOONCAKE:
        if "metrics" in purpose:
            return ("kv", "mooncake", "metrics_port")
        if "http metadata" in purpose:
            return ("kv", "mooncake", "http_metadata_port")
        return ("kv", "mooncake", "port")
    return ("proxy", "port")


def _field(path: Path_) -> str:
    return ".".join(str(p) for p in path)


def _span(ports: list[int]) -> str:
    lo, hi = min(ports), max(ports)
    return f"port {lo}" if lo == hi else f"{len(set(ports))} ports in {lo}-{hi}"


def rule_ports(c: Checker) -> None:
    """One message per problem: all overflowing ports of one field together, and all clashes
    between the same two fields together (a kv_port range overlapping another counts once)."""
    over: dict[Path_, list[tuple[ProcessDraft, int]]] = {}
    seen: dict[tuple[str, int], tuple[ProcessDraft, str, Path_]] = {}
    clashes: dict[tuple[Path_, Path_], list[tuple[str, int, str, str]]] = {}
    located: dict[tuple[Path_, Path_], Path_] = {}
    for proc in c.procs:
        for port, purpose in proc.ports:
            field = port_field(proc, purpose)
            if port > 65535:
                over.setdefault(field, []).append((proc, port))
                continue
            key = (proc.host, port)
            if key in seen:
                first, first_purpose, first_field = seen[key]
                pair = (first_field, field) if first_field <= field else (field, first_field)
                located.setdefault(pair, field)  # the field whose port arrived second
                clashes.setdefault(pair, []).append(
                    (proc.host, port, f"{first.name} ({first_purpose})", f"{proc.name} ({purpose})")
                )
            else:
                seen[key] = (proc, purpose, field)
    for field, items in over.items():
        names = sorted({p.name for p, _ in items})
        top = max(port for _, port in items)
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        c.err(
            field,
            f"{_span([port for _, port in items])} of {shown} lie above 65535 (ports are "
            f"{_field(field)} plus an offset per process and rank). Lower {_field(field)} by "
            f"at least {top - 65535}.",
        )
    for pair, pairs in clashes.items():
        field = located[pair]
        first_field = pair[0] if pair[1] == field else pair[1]
        host, port, a, b = pairs[0]
        hosts = sorted({h for h, _, _, _ in pairs})
        where = f"host '{host}'" if len(hosts) == 1 else f"{len(hosts)} hosts ({', '.join(hosts)})"
        more = f" (and {len(pairs) - 1} more)" if len(pairs) > 1 else ""
        fix = (
            f"Move {_field(field)}"
            if field == first_field
            else f"Move {_field(field)} or {_field(first_field)}"
        )
        ports = sorted({p for _, p, _, _ in pairs})
        what = (
            f"port {port} on {where} is used twice: {a} and {b}."
            if len(ports) == 1
            else f"{_span(ports)} on {where} are used twice (port {port}: {a} and {b}{more})."
        )
        c.err(field, f"{what} {fix} so the ranges do not overlap.")
