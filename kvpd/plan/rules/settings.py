"""Settings that would be silently ignored or read two ways: refused or named plainly."""

from __future__ import annotations

from kvpd.plan.rules.base import Checker
from kvpd.profile.roles import ENGINE_ROLES, Role

# Connectors that bind the group's kv_port (MooncakeConnectorV1/Layerwise side channels, the
# NIXL side channel); SfaRemoteD2HConnector binds it on decode only.
KV_PORT_USERS = frozenset({"mooncake", "mooncake_layerwise", "nixl"})


def uses_kv_port(role: str, connectors: list[str]) -> bool:
    return bool(KV_PORT_USERS & set(connectors)) or (
        role == Role.DECODE and "sfa_d2h" in connectors
    )


def rule_kv_port_used(c: Checker) -> None:
    """An explicit kv_port that no connector of the group binds would be dropped unseen."""
    for role in ENGINE_ROLES:
        g = c.p.group(role)
        if g is None or g.kv_port is None or uses_kv_port(role, list(g.kv_connectors)):
            continue
        users = "mooncake, mooncake_layerwise, nixl, or sfa_d2h on decode"
        c.err(
            (role, "kv_port"),
            f"kv_port {g.kv_port} is set, but {role}'s connectors "
            f"({', '.join(g.kv_connectors) or 'none'}) bind no KV port, so it would be ignored. "
            f"Remove kv_port (only {users} use one).",
        )


def rule_attention_name(c: Checker) -> None:
    """mla, sfa and dsa size KV the same way; say which name fits the model's facts."""
    m = c.p.model
    if m.attention == "dsa":
        c.warn(
            ("model", "attention"),
            "dsa (DeepSeek Sparse Attention, the model-side name) is planned exactly like sfa, "
            "the name of vLLM-Ascend's backend that kvpd uses for latent attention with a "
            "sparse indexer. Write attention: sfa.",
        )
    elif m.attention == "mla" and m.index_topk is not None:
        c.warn(
            ("model", "attention"),
            f"mla with index_topk {m.index_topk}: a model with a sparse indexer (DeepSeek-V3.2, "
            "GLM-5) is sfa. Write attention: sfa, or drop index_topk for a dense MLA model.",
        )
    elif m.attention == "sfa" and m.index_topk is None:
        c.warn(
            ("model", "attention"),
            "sfa without index_topk: sfa is latent attention with a sparse indexer; give "
            "index_topk from config.json, or write attention: mla for a dense MLA model.",
        )
