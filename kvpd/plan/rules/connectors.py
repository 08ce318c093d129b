"""KV connector choice per group, roles, and what prefill and decode must share."""

from __future__ import annotations

from kvpd.plan.layout import hardware_of
from kvpd.plan.rules.base import Checker
from kvpd.profile.roles import Role
from kvpd.profile.schema import ASCEND

ASCEND_ONLY = {"sfa_d2h", "ascend_store", "mooncake", "mooncake_layerwise", "ucm"}
# Connectors that hand KV from a prefill instance to a decode instance.
P2P = frozenset({"sfa_d2h", "mooncake", "mooncake_layerwise", "nixl"})
# Connectors whose block keys use Python's hash() (vLLM's NONE_HASH seed): PYTHONHASHSEED.
HASHING = frozenset({"ascend_store", "mooncake", "mooncake_layerwise"})


def rule_roles(c: Checker) -> None:  # noqa: C901 — a flat checklist: one independent check per connector fact, no nesting
    for role, g in c.groups():
        if g.kv_role in ("kv_producer", "kv_consumer") and role == Role.MIXED:
            c.err(
                (role, "kv_role"),
                f"a mixed group both prefills and decodes; {g.kv_role} would make it only "
                "save or only load KV. Use kv_both (the default) or leave kv_role unset.",
            )
        if g.kv_role == "kv_consumer" and role == Role.PREFILL:
            c.err(
                (role, "kv_role"),
                "prefill cannot be kv_consumer: it produces KV. Use kv_producer (or kv_both).",
            )
        if g.kv_role == "kv_producer" and role == Role.DECODE:
            c.err(
                (role, "kv_role"),
                "decode cannot be kv_producer: it consumes KV. Use kv_consumer (or kv_both).",
            )
        for comp in g.kv_connectors:
            hws = {hardware_of(c.p, h) for h in g.hosts}
            if comp in ASCEND_ONLY and not hws & set(ASCEND):
                c.err(
                    (role, "kv_connectors"),
                    f"{comp} runs only on Ascend hosts, but "
                    f"{role} runs on {', '.join(sorted(hws))}. On cpu/cuda use "
                    "kvpd_store, example or nixl (or `kvpd up --rehearse`).",
                    on_hardware=True,
                )
        comps = g.kv_connectors
        if len(set(comps)) != len(comps):
            c.err(
                (role, "kv_connectors"),
                "a KV connector is listed twice. List each connector once.",
            )
        if "example" in comps and not c.p.kv.example_path:
            c.err(
                ("kv", "example_path"),
                "ExampleConnector needs a shared folder: set `kv.example_path` to a folder "
                "every instance can reach.",
            )
        if "kvpd_store" in comps and c.p.kv.kvpd_store is None:
            c.err(
                ("kv", "kvpd_store"),
                "kvpd_store needs its folder: add `kv.kvpd_store: {path: <folder>}`.",
            )
        if "ucm" in comps and c.p.kv.ucm is None:
            c.err(
                ("kv", "ucm"),
                "the ucm connector needs its storage: add `kv.ucm: {storage: <shared dir>}`.",
            )
        if set(comps) & {"mooncake", "mooncake_layerwise"} and c.p.kv.mooncake is None:
            c.err(
                ("kv", "mooncake"),
                "mooncake needs the master: add `kv.mooncake: {host: "
                "<host>}` (its address goes into every mooncake.json).",
            )


def rule_consistency(c: Checker) -> None:
    """What prefill and decode must agree on: block size, hash seed, UCM's block-key inputs."""
    p, d = c.f.group("prefill"), c.f.group("decode")
    if p is not None and d is not None:
        if p.block_size != d.block_size:
            c.err(
                ("decode", "block_size"),
                f"prefill block_size {p.block_size} differs from decode {d.block_size}; KV "
                "blocks must have the same size on both sides. Set one `block_size` under "
                "`engine:` (or model.block_size) and drop the group overrides.",
            )
        if "ucm" in p.connectors and "ucm" in d.connectors and p.group.tp != d.group.tp:
            c.err(
                ("decode", "tp"),
                f"UCM keys blocks by TP size: prefill tp {p.group.tp} and decode tp "
                f"{d.group.tp} would never share a block. Use the same tp on both.",
            )
    gfs = c.gfacts()
    seeds = {g.role: g.env.get("PYTHONHASHSEED") for g in gfs}
    if len(set(seeds.values())) > 1:
        shown = ", ".join(f"{r} {v if v is not None else 'unset'}" for r, v in seeds.items())
        last = gfs[-1].role
        c.err(
            (last, "env", "PYTHONHASHSEED"),
            f"PYTHONHASHSEED differs between groups ({shown}); block hashes would not match. "
            "Set it once in the top-level `env:` and remove the group values.",
        )
        return
    for g in gfs:
        hashing = sorted(HASHING & g.connectors)
        if hashing and g.env.get("PYTHONHASHSEED") is None:
            c.warn(
                ("env",),
                f"PYTHONHASHSEED is not set, but {g.role} uses {', '.join(hashing)}, whose "
                "block hashes differ between processes unless the seed is identical "
                'everywhere. Add `env: {PYTHONHASHSEED: "0"}`.',
            )
            break


def rule_pairs(c: Checker) -> None:
    """P2P connectors need both sides (a producer on prefill, a consumer on decode)."""
    p, d, m = c.f.group("prefill"), c.f.group("decode"), c.f.group("mixed")
    if m is not None:
        p2p = sorted(m.connectors & P2P)
        if p2p:
            c.err(
                ("mixed", "kv_connectors"),
                f"{', '.join(p2p)} moves KV from a prefill to a decode instance; a mixed group "
                "has neither. Use a prefix-cache connector (ucm, kvpd_store, ascend_store) or "
                "split it into prefill: and decode: groups.",
            )
    if p is None or d is None:
        return
    for comp in sorted(P2P):
        if comp in d.connectors and comp not in p.connectors:
            c.err(
                ("prefill", "kv_connectors"),
                f"decode consumes KV through {comp}, but prefill has no {comp} producer, so "
                f"no KV would ever arrive. Add {comp} to prefill.kv_connectors.",
            )
        elif comp in p.connectors and comp not in d.connectors:
            c.err(
                ("decode", "kv_connectors"),
                f"prefill produces KV through {comp}, but decode has no {comp} consumer to "
                f"receive it. Add {comp} to decode.kv_connectors.",
            )
    for gf in (p, d):
        several = sorted(gf.connectors & P2P)
        if len(several) > 1:
            c.err(
                (gf.role, "kv_connectors"),
                f"{' and '.join(several)} both return kv_transfer_params; a MultiConnector "
                "allows only one such child. Keep one P2P connector per group.",
            )


def rule_mixed(c: Checker) -> None:
    """Decision: `mixed:` is a deployment of its own, never beside prefill/decode groups."""
    if c.p.mixed is not None and (c.p.prefill is not None or c.p.decode is not None):
        c.err(
            ("mixed",),
            "a mixed group cannot be combined with prefill/decode groups: the proxy would send "
            "requests to mixed engines as if they were decoders, without KV from prefill. Use "
            "either `mixed:` alone or `prefill:` + `decode:`.",
        )
