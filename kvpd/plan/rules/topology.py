"""Hosts, groups and parallelism: what runs where, and whether it fits."""

from __future__ import annotations

import difflib

from kvpd.plan.layout import dp_size_local, host_devices
from kvpd.plan.rules.base import Checker, Path_
from kvpd.profile.types import is_loopback


def _host_ref(c: Checker, path: Path_, name: str) -> None:
    if name not in c.p.hosts:
        close = difflib.get_close_matches(name, list(c.p.hosts), n=1, cutoff=0.5)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        c.err(
            path,
            f"unknown host '{name}'.{hint} Declared hosts: {', '.join(c.p.hosts)}. Use one of "
            "them or add it under `hosts:`.",
        )


def rule_host_refs(c: Checker) -> None:
    for role, g in c.groups():
        for i, h in enumerate(g.hosts):
            _host_ref(c, (role, "hosts", i), h)
        if g.dp_address:
            _host_ref(c, (role, "dp_address"), g.dp_address)
    kv = c.p.kv
    if kv.memcache:
        _host_ref(c, ("kv", "memcache", "host"), kv.memcache.host)
    if kv.mooncake:
        _host_ref(c, ("kv", "mooncake", "host"), kv.mooncake.host)
    if c.p.proxy:
        _host_ref(c, ("proxy", "host"), c.p.proxy.host)
    for h in c.p.rehearsal.standin_python:
        _host_ref(c, ("rehearsal", "standin_python", h), h)
    addrs: dict[str, str] = {}
    for name, host in c.p.hosts.items():
        if host.address in addrs:
            c.err(
                ("hosts", name, "address"),
                f"address {host.address} is also host '{addrs[host.address]}'. Each host needs "
                "its own address (list it once and give its engines different ports).",
            )
        addrs[host.address] = name


def rule_loopback_hosts(c: Checker) -> None:
    """A host known by a loopback address cannot be reached from the other hosts: its engines
    would get no KV and no requests, its Mooncake master no clients. (The MetaService has a
    rule of its own; a host that only runs the proxy is fine, the controller reaches it.)"""
    p = c.p
    if not any(is_loopback(h.address) for h in p.hosts.values()):
        return
    runs: dict[str, list[str]] = {}
    for role, g in c.groups():
        for h in g.hosts:
            runs.setdefault(h, []).append(f"{role} engines")
    if p.kv.mooncake:
        runs.setdefault(p.kv.mooncake.host, []).append("the Mooncake master")
    if p.proxy:
        runs.setdefault(p.proxy.host, []).append("the proxy")
    remote = sorted(h for h in runs if h in p.hosts and not is_loopback(p.hosts[h].address))
    if not remote:
        return  # everything on this machine: loopback is right
    others = ("host " if len(remote) == 1 else "hosts ") + ", ".join(remote)
    for name, what in runs.items():
        host = p.hosts.get(name)
        if host is None or not is_loopback(host.address) or what == ["the proxy"]:
            continue
        c.err(
            ("hosts", name, "address"),
            f"host '{name}' has the loopback address {host.address}, but it runs "
            f"{' and '.join(dict.fromkeys(what))} that {others} must reach, and "
            f"there {host.address} is the host itself. Set hosts.{name}.address to its address "
            "on the network the hosts share.",
        )


def rule_groups_present(c: Checker) -> None:
    p = c.p
    if not (p.prefill or p.decode or p.mixed):
        c.err(("prefill",), "no engines: add `prefill:` and `decode:` groups (P/D) or `mixed:`.")
        return
    if bool(p.prefill) != bool(p.decode):
        have, miss = ("prefill", "decode") if p.prefill else ("decode", "prefill")
        c.err(
            (have,),
            f"`{have}:` without `{miss}:`. P/D needs both groups: add `{miss}:`, or rename "
            f"`{have}:` to `mixed:` for a single group of engines that prefill and decode.",
        )
    if p.prefill and p.decode:
        for role in ("prefill", "decode"):
            g = p.engine_group(role)
            if not g.kv_connectors:
                c.err(
                    (role, "kv_connectors"),
                    f"{role} has no KV connector, so KV cannot move "
                    "from prefill to decode. Set e.g. `kv_connectors: [mooncake]`.",
                )
        if p.proxy is None:
            c.err(
                ("proxy",),
                "P/D needs a proxy in front of the engines. Add `proxy: {host: "
                "<host>, port: <port>}`.",
            )


def rule_parallelism(c: Checker) -> None:  # noqa: C901 — a flat checklist: one independent check per parallelism setting
    for role, g in c.groups():
        if any(h not in c.p.hosts for h in g.hosts):
            continue
        local = dp_size_local(c.p, g)
        for h in g.hosts:
            devs = host_devices(c.p, c.p.hosts[h])
            if g.tp * g.pp > devs:
                c.err(
                    (role, "tp"),
                    f"tp {g.tp} x pp {g.pp} needs {g.tp * g.pp} devices on one "
                    f"host but '{h}' has {devs}. Lower tp or set `hosts.{h}.devices`.",
                )
                return
            if local * g.tp * g.pp > devs:
                c.err(
                    (role, "dp_size_local"),
                    f"dp_size_local {local} x tp {g.tp} x pp {g.pp} "
                    f"= {local * g.tp * g.pp} devices per host, but '{h}' has {devs}. "
                    f"Use dp_size_local <= {devs // (g.tp * g.pp)}.",
                )
                return
        if local > g.dp:
            c.err(
                (role, "dp_size_local"),
                f"dp_size_local {local} is larger than dp {g.dp}. Set dp_size_local <= {g.dp}.",
            )
        elif g.dp % local:
            c.err(
                (role, "dp_size_local"),
                f"dp {g.dp} is not a multiple of dp_size_local "
                f"{local}: every host must hold the same number of DP ranks. Use a dp that is a "
                f"multiple of {local} (e.g. {g.dp + (-g.dp) % local}) or change dp_size_local.",
            )
        if g.dp_launch == "single" and local < g.dp:
            c.err(
                (role, "dp_launch"),
                f"dp_launch single runs all {g.dp} DP ranks in one "
                f"process, but only {local} fit on a host. Use dp_launch: per_rank.",
            )
        covered = sorted(r for ep in c.layout.procs if ep.role == role for r in ep.dp_ranks)
        want = sorted(list(range(g.dp)) * g.instances)
        if not c.layout.problems and covered != want:
            c.err(
                (role, "dp"),
                f"DP ranks placed {covered} do not cover 0..{g.dp - 1} exactly once per "
                "instance. Check dp, dp_size_local and the hosts' devices.",
            )
    p, d = c.p.prefill, c.p.decode
    if p and d:
        needs_ratio = {"sfa_d2h", "mooncake", "mooncake_layerwise"} & (
            set(p.kv_connectors) | set(d.kv_connectors)
        )
        if needs_ratio and (p.tp < d.tp or p.tp % d.tp):
            c.err(
                ("prefill", "tp"),
                f"prefill tp {p.tp} must be >= decode tp {d.tp} and "
                f"divisible by it ({', '.join(sorted(needs_ratio))} maps each prefill rank to "
                f"decode rank p_rank // (p_tp / d_tp)). Use e.g. prefill tp "
                f"{d.tp * max(1, p.tp // d.tp)}.",
            )
        if d.pp > 1 and (set(d.kv_connectors) & {"mooncake", "mooncake_layerwise", "sfa_d2h"}):
            c.err(
                ("decode", "pp"),
                f"decode pp must be 1 with {', '.join(sorted(set(d.kv_connectors)))} (the "
                "connector refuses decode pp > 1). Set decode.pp: 1.",
            )


def rule_model(c: Checker) -> None:
    if c.p.model.max_model_len is None and not any(g.max_model_len for g in c.gfacts()):
        c.warn(
            ("model", "max_model_len"),
            "not set: vLLM uses the model's maximum, and kvpd cannot "
            "size KV pools. Set model.max_model_len.",
        )


def rule_dp_layout(c: Checker) -> None:
    """The DP master on the group's rank 0 (idle hosts: `kvpd.plan.rules.placement`)."""
    if c.layout.problems:
        return
    for role, g in c.groups():
        if any(h not in c.p.hosts for h in g.hosts):
            continue
        if g.dp_address and g.dp_address in c.p.hosts and g.dp > 1:
            first = next(
                (ep.host for ep in c.layout.procs if ep.role == role and 0 in ep.dp_ranks), None
            )
            if first is not None and first != g.dp_address:
                c.err(
                    (role, "dp_address"),
                    f"dp_address '{g.dp_address}' is not where {role} DP rank 0 runs "
                    f"('{first}'), so the other ranks would wait for a DP master that never "
                    f"listens. Set dp_address: {first} or leave it unset.",
                )


def rule_tp_heads(c: Checker) -> None:
    """vLLM shards KV heads over TP ranks: tp must divide kv_heads or be a multiple of it."""
    m = c.p.model
    if m.attention not in ("mha", "gqa") or m.kv_heads is None:
        return
    for role, g in c.groups():
        tp, heads = g.tp, m.kv_heads
        if (tp <= heads and heads % tp) or (tp > heads and tp % heads):
            ok = [t for t in (1, 2, 4, 8, 16, 32) if heads % t == 0 or t % heads == 0]
            c.err(
                (role, "tp"),
                f"tp {tp} cannot shard the model's {heads} KV heads (tp must divide them or be "
                f"a multiple of them). Use tp {' or '.join(str(t) for t in ok[:4])}.",
            )
