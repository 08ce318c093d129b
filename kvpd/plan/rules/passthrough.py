"""Pass-through settings that would change what kvpd derives, or that a service refuses (pure).

`kv.mooncake.extra_args` go to `mooncake_master` verbatim. A flag there that moves what kvpd
derives (its RPC port, RPC or metrics address, config files kvpd cannot read) would make every
`mooncake.json` and the readiness check point elsewhere; an unknown flag makes the master abort
at start (gflags: "unknown command line flag"). Flags are those of `mooncake_master --helpfull`
0.3.13.post1 (shared/reference/kv-stores.md, Appendix A). UCM's PipelineStore builds only
the store chains it registers (anything else: "unknown store pipeline" at engine start).
"""

from __future__ import annotations

import difflib

from kvpd.plan.rules.base import Checker

# mooncake_master 0.3.13.post1 flags (name -> type), gflags' own included.
MASTER_FLAG_TYPES = dict(
    item.split(":")
    for item in (
        "allocation_strategy:string allow_evict_soft_pinned_objects:bool "
        "batch_oplog_retry_timeout_sec:uint32 client_ttl:int64 cluster_id:string "
        "config_path:string cxl_path:string cxl_size:uint64 default_kv_lease_ttl:string "
        "default_kv_soft_pin_ttl:string dynamic_replication_admission_qps_threshold:double "
        "dynamic_replication_heat_window_seconds:uint32 "
        "dynamic_replication_max_memory_replicas:uint64 dynamic_replication_mode:string "
        "enable_cxl:bool enable_disk_eviction:bool enable_ha:bool "
        "enable_http_metadata_server:bool enable_kv_events:bool "
        "enable_metadata_cleanup_on_timeout:bool enable_metric_reporting:bool "
        "enable_multi_tenants:bool enable_offload:bool enable_oplog:bool enable_snapshot:bool "
        "enable_snapshot_restore:bool etcd_endpoints:string "
        "eviction_high_watermark_ratio:double eviction_ratio:double "
        "global_file_segment_size:int64 ha_backend_connstring:string ha_backend_type:string "
        "http_metadata_server_host:string http_metadata_server_port:int32 "
        "kv_events_additional_salt:string kv_events_backend_id:string "
        "kv_events_bind_endpoint:string kv_events_block_size:uint32 kv_events_dp_rank:uint32 "
        "kv_events_emit_legacy_compat:bool kv_events_emit_object_key:bool "
        "kv_events_lora_name:string kv_events_model_name:string kv_events_queue_capacity:uint32 "
        "kv_events_tenant_id:string max_kv_soft_pin_ttl:string max_retry_attempts:uint32 "
        "max_threads:int32 max_total_finished_tasks:uint32 max_total_pending_tasks:uint32 "
        "max_total_processing_tasks:uint32 memory_allocator:string metrics_host:string "
        "metrics_port:int32 nof_eviction_high_watermark_ratio:double nof_eviction_ratio:double "
        "nof_heartbeat_failures_threshold:uint32 nof_heartbeat_interval_sec:int64 "
        "nof_heartbeat_probe_timeout_ms:uint32 offload_cap_ratio:double "
        "offload_force_evict:bool offload_on_evict:bool offloading_queue_limit:uint64 "
        "oplog_batch_max_entries:uint32 oplog_poll_interval_ms:int32 "
        "pending_task_timeout_sec:uint64 pod_name:string pod_namespace:string port:int32 "
        "processing_task_timeout_sec:uint64 promotion_admission_threshold:uint32 "
        "promotion_max_per_heartbeat:uint32 promotion_on_hit:bool promotion_queue_limit:uint32 "
        "put_start_discard_timeout_sec:uint64 put_start_release_timeout_sec:uint64 "
        "quota_bytes:uint64 root_fs_dir:string rpc_address:string "
        "rpc_conn_timeout_seconds:int32 rpc_enable_tcp_no_delay:bool rpc_interface:string "
        "rpc_port:int32 rpc_thread_num:int32 snapshot_backup_dir:string "
        "snapshot_catalog_backend_connstring:string snapshot_catalog_backend_type:string "
        "snapshot_catalog_store_connstring:string snapshot_catalog_store_type:string "
        "snapshot_child_timeout_seconds:uint64 snapshot_interval_seconds:uint64 "
        "snapshot_object_store_type:string snapshot_payload_backend_type:string "
        "snapshot_payload_store_type:string snapshot_retention_count:uint32 "
        "tenant_quota_connector_type:string tenant_quota_connector_uri:string "
        "mmap_arena_pool_size:uint64 use_mmap_arena_allocator:bool flagfile:string "
        "fromenv:string tryfromenv:string version:bool"
    ).split()
)

# Flags that move what kvpd derives from the profile: the field to use instead, or why not.
DERIVATION_FLAGS = {
    "rpc_port": "set kv.mooncake.port (every mooncake.json and the readiness check use it)",
    "rpc_address": "leave it unset: the master listens on its host's address, which every "
    "mooncake.json names (kv.mooncake.host)",
    "rpc_interface": "leave it unset: the master listens on kv.mooncake.host's address",
    "metrics_host": "leave it unset: `up` reads the master's /health on its host's address",
    "http_metadata_server_host": "leave it unset: kvpd derives it from kv.mooncake.host",
    "config_path": "put the options in extra_args, where kvpd can check them",
    "flagfile": "put the options in extra_args, where kvpd can check them",
    "fromenv": "put the options in extra_args, where kvpd can check them",
    "tryfromenv": "put the options in extra_args, where kvpd can check them",
}


def master_flag(arg: str) -> str | None:
    """The gflags name of one argv word (`--x=1`, `-x`, `--nox` for a bool), None for a value."""
    if not arg.startswith("-") or arg in ("-", "--"):
        return None
    name = arg.lstrip("-").split("=", 1)[0]
    if name not in MASTER_FLAG_TYPES and name.startswith("no"):
        if MASTER_FLAG_TYPES.get(name[2:]) == "bool":
            return name[2:]
    return name


def rule_mooncake_passthrough(c: Checker) -> None:
    mk = c.p.kv.mooncake
    if mk is None:
        return
    for i, arg in enumerate(mk.extra_args):
        name = master_flag(arg)
        if name is None:
            continue
        path = ("kv", "mooncake", "extra_args", i)
        if name in DERIVATION_FLAGS:
            c.err(
                path,
                f"--{name} changes what kvpd derives for the Mooncake master; remove it and "
                f"{DERIVATION_FLAGS[name]}.",
            )
        elif name not in MASTER_FLAG_TYPES:
            close = difflib.get_close_matches(name, list(MASTER_FLAG_TYPES), n=1, cutoff=0.7)
            hint = f" Did you mean --{close[0]}?" if close else ""
            c.err(
                path,
                f"{arg.split('=', 1)[0]} is not a mooncake_master flag (0.3.13: the master "
                f"aborts on unknown flags).{hint} Remove it or fix its name "
                "(`mooncake_master --helpfull` lists them).",
            )


# UCM PipelineStore's registered chains (ucm/store/pipeline; kv-stores.md, UCM section).
UCM_PIPELINES = ("Cache|Posix", "Cache|Ds3fs", "Cache|Empty", "Empty", "Fake", "Posix")


def rule_ucm_pipeline(c: Checker) -> None:
    u = c.p.kv.ucm
    if u is None or u.connector != "UcmPipelineStore" or u.pipeline in UCM_PIPELINES:
        return
    close = difflib.get_close_matches(u.pipeline, UCM_PIPELINES, n=1, cutoff=0.6)
    c.err(
        ("kv", "ucm", "pipeline"),
        f"{u.pipeline!r} is not a UCM store pipeline (UCM refuses it at start: 'unknown store "
        f"pipeline'); use one of {', '.join(UCM_PIPELINES)}"
        + (f" (did you mean {close[0]}?)" if close else "")
        + ". Shared storage is Cache|Posix on the mounted path.",
    )
