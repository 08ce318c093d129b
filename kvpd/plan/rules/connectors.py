"""KV connector choice per group, roles, and what prefill and decode must share."""

from __future__ import annotations

from kvpd.plan.layout import hardware_of, merged
from kvpd.plan.rules.base import Checker
from kvpd.profile.schema import ASCEND

ASCEND_ONLY = {"sfa_d2h", "ascend_store", "mooncake", "mooncake_layerwise", "ucm"}


def rule_roles(c: Checker) -> None:
    for role, g in c.groups():
        if g.kv_role == "kv_consumer" and role == "prefill":
            c.err(
                (role, "kv_role"),
                "prefill cannot be kv_consumer: it produces KV. Use kv_producer (or kv_both).",
            )
        if g.kv_role == "kv_producer" and role == "decode":
            c.err(
                (role, "kv_role"),
                "decode cannot be kv_producer: it consumes KV. Use kv_consumer (or kv_both).",
            )
        if not c.rehearse:
            for comp in g.kv_connectors:
                hws = {hardware_of(c.p, h) for h in g.hosts}
                if comp in ASCEND_ONLY and not hws & set(ASCEND):
                    c.err(
                        (role, "kv_connectors"),
                        f"{comp} runs only on Ascend hosts, but "
                        f"{role} runs on {', '.join(sorted(hws))}. On cpu/cuda use "
                        "kvpd_store, example or nixl (or `kvpd up --rehearse`).",
                    )
        comps = g.kv_connectors
        if len(set(comps)) != len(comps):
            c.err((role, "kv_connectors"), "a KV connector is listed twice.")
        if "example" in comps and not c.p.kv.example_path:
            c.err(
                ("kv", "example_path"),
                "ExampleConnector needs a shared folder: set `kv.example_path`.",
            )
        if "kvpd_store" in comps and c.p.kv.kvpd_store is None:
            c.err(("kv", "kvpd_store"), "kvpd_store needs `kv.kvpd_store: {path: <folder>}`.")
        if "ucm" in comps and c.p.kv.ucm is None:
            c.err(("kv", "ucm"), "the ucm connector needs `kv.ucm: {storage: <shared dir>}`.")
        if set(comps) & {"mooncake", "mooncake_layerwise"} and c.p.kv.mooncake is None:
            c.err(
                ("kv", "mooncake"),
                "mooncake needs the master: add `kv.mooncake: {host: "
                "<host>}` (its address goes into every mooncake.json).",
            )


def rule_consistency(c: Checker) -> None:
    p, d = c.p.prefill, c.p.decode
    if not (p and d):
        return
    po, do = merged(c.p, p), merged(c.p, d)
    if (po.block_size or c.p.model.block_size) != (do.block_size or c.p.model.block_size):
        c.err(
            ("decode", "block_size"),
            f"prefill block_size {po.block_size} differs from decode "
            f"{do.block_size}; KV blocks must have the same size on both sides.",
        )
    seeds = {
        r: {**c.p.env, **(merged(c.p, g).env or {})}.get("PYTHONHASHSEED")
        for r, g in (("prefill", p), ("decode", d))
    }
    if seeds["prefill"] != seeds["decode"]:
        c.err(
            ("decode", "env", "PYTHONHASHSEED"),
            f"PYTHONHASHSEED differs (prefill "
            f"{seeds['prefill']}, decode {seeds['decode']}); block hashes would not match. "
            "Set it once in the top-level `env:`.",
        )
    elif seeds["prefill"] is None and {"ascend_store", "mooncake", "mooncake_layerwise"} & (
        set(p.kv_connectors) | set(d.kv_connectors)
    ):
        c.warn(
            ("env",),
            "PYTHONHASHSEED is not set; KV-pool block hashes differ between processes "
            'unless it is identical everywhere. Add `env: {PYTHONHASHSEED: "0"}`.',
        )
