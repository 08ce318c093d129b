"""Cross-field rules from the guides and the vLLM-Ascend / KV-store code (pure).

Each rule appends `Finding`s: errors stop the plan, warnings are shown with it. A finding names
the profile field it is about; the plan builder turns that into `file:line: field: message`.
Rules are grouped by domain (one module each) and all read one precomputed `Facts` value.
"""

from __future__ import annotations

from collections.abc import Callable

from kvpd.plan.facts import Facts
from kvpd.plan.rules import (
    audit_warnings,
    bench,
    capacity,
    connectors,
    containers,
    env,
    files,
    flow,
    host_memory,
    kvservices,
    logs,
    memcache,
    nic,
    offload,
    passthrough,
    placement,
    planner,
    ports,
    settings,
    topology,
    vllm_limits,
)
from kvpd.plan.rules.base import Checker, Finding

Rule = Callable[[Checker], None]

RULES: tuple[Rule, ...] = (
    bench.rule_bench,
    bench.rule_scenarios,
    bench.rule_bench_host,
    topology.rule_host_refs,
    topology.rule_loopback_hosts,
    topology.rule_groups_present,
    topology.rule_parallelism,
    topology.rule_dp_layout,
    placement.rule_idle_hosts,
    placement.rule_idle_devices,
    topology.rule_tp_heads,
    capacity.rule_attention_heads,
    capacity.rule_device_count,
    capacity.rule_device_memory,
    capacity.rule_sparse_pool_one_sequence,
    capacity.rule_bench_fits_prefill,
    connectors.rule_mixed,
    connectors.rule_roles,
    connectors.rule_pairs,
    env.rule_args,
    env.rule_env,
    env.rule_numeric_ips,
    offload.rule_layerwise,
    offload.rule_sparse,
    planner.rule_planner,
    offload.rule_memfabric,
    memcache.rule_memcache,
    kvservices.rule_mooncake,
    kvservices.rule_mooncake_parallel,
    kvservices.rule_mooncake_timeouts,
    kvservices.rule_mooncake_args,
    kvservices.rule_ucm,
    connectors.rule_consistency,
    ports.rule_proxy,
    ports.rule_ports,
    topology.rule_model,
    settings.rule_kv_port_used,
    settings.rule_attention_name,
    logs.rule_log_names,
    containers.rule_containers,
    # what a real cluster would still hit (each module says why)
    passthrough.rule_mooncake_passthrough,
    passthrough.rule_ucm_pipeline,
    host_memory.rule_host_memory,
    vllm_limits.rule_batched_tokens,
    vllm_limits.rule_platform_plugin,
    flow.rule_proxy_placement,
    flow.rule_proxy_script,
    files.rule_store_path,
    files.rule_hash_seed,
    audit_warnings.rule_store_sharing,
    audit_warnings.rule_model_lengths,
    audit_warnings.rule_prefix_seed,
    audit_warnings.rule_container_shm,
    audit_warnings.rule_proxy_waits,
    nic.rule_nic,
)


def check(facts: Facts) -> list[Finding]:
    """Every finding for one profile, in rule order, then the layout's own problems."""
    c = Checker(facts)
    for rule in RULES:
        rule(c)
    for path, msg in facts.layout.problems:
        c.err(path, msg)
    return c.findings


__all__ = ["Finding", "check"]
