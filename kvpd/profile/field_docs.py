"""Descriptions of the profile fields whose `Field(...)` does not carry one, by `Model.field`.

`_Model` copies them onto its fields when each model class is built, so the JSON Schema of
`kvpd schema` and every reader of `model_fields` see one description per field. Kept apart so
the schema modules stay short; a subclass finds its base classes' entries (Group gets
ServeOptions'). tests/unit/test_schema_docs.py checks that no field is left without one.
"""

from __future__ import annotations

DOCS: dict[str, str] = {
    # --- the profile -----------------------------------------------------------------------
    "Profile.name": "deployment name: state lives in .kvpd/<name>/ and run dirs default to it",
    "Profile.description": "one line shown with the bundled profiles",
    "Profile.hardware": "default hardware of every host: a2 | a3 | 950 (Ascend), cuda, cpu",
    "Profile.ssh": "how to log in to every host (a host's own `ssh:` overrides any field)",
    "Profile.hosts": "every machine of the deployment by name: address, devices, NIC, ...",
    "Profile.model": "the served model and the facts kvpd sizes KV caches and pools from",
    "Profile.runtime": "commands and directories on the hosts",
    "Profile.kv": "the KV services kvpd starts or configures (memcache, Mooncake, UCM, ...)",
    "Profile.engine": "`vllm serve` options of every group (a group's own settings win)",
    "Profile.prefill": "the prefill engines of P/D disaggregation (needs `decode:` and `proxy:`)",
    "Profile.decode": "the decode engines of P/D disaggregation",
    "Profile.mixed": "engines that prefill and decode (no P/D split); without a proxy the first "
    "engine is the endpoint",
    "Profile.proxy": "the P/D proxy clients send requests to",
    "Profile.bench": "defaults of `kvpd bench`",
    "Profile.rehearsal": "how `--rehearse` runs this topology on CPU hosts",
    "SSH.port": "SSH port (22 means unset: ~/.ssh/config's Port applies)",
    "Host.ssh": "this host's login, overriding the top-level `ssh:` field by field",
    "Runtime.health_timeout_s": "how long `up` waits for an engine to become healthy",
    "Rehearsal.health_timeout_s": "how long a rehearsal waits for each CPU engine",
    # --- model -------------------------------------------------------------------------------
    "ModelSpec.path": "model path on the hosts, passed to `vllm serve`",
    "ModelSpec.served_name": "--served-model-name (default: path); what clients ask for",
    "ModelSpec.layers": "num_hidden_layers: KV bytes a token scale with it",
    "ModelSpec.kv_heads": "num_key_value_heads of MHA/GQA models; tp must divide them or be a "
    "multiple of them",
    "ModelSpec.head_dim": "head dimension of MHA/GQA models (default hidden_size / heads)",
    "ModelSpec.qk_rope_head_dim": "rope part of the MLA/SFA/DSA latent (64 on DeepSeek/GLM)",
    "ModelSpec.dtype": "KV-cache dtype the sizes are computed for (auto: 2 bytes)",
    "ModelSpec.block_size": "KV block size in tokens, for the sparse-offload sizing",
    "ModelSpec.max_model_len": "longest sequence served (--max-model-len); sizes every KV pool",
    # --- vllm serve ---------------------------------------------------------------------------
    "ServeOptions.gpu_memory_utilization": "--gpu-memory-utilization: share of device memory "
    "vLLM takes (unset: vLLM's 0.9)",
    "ServeOptions.seed": "--seed",
    "ServeOptions.max_model_len": "--max-model-len (default: model.max_model_len)",
    "ServeOptions.max_num_batched_tokens": "--max-num-batched-tokens: tokens per scheduler step",
    "ServeOptions.max_num_seqs": "--max-num-seqs: sequences an engine runs at once (unset: "
    "vLLM's 256); sizes the memcache and sparse host pools",
    "ServeOptions.trust_remote_code": "--trust-remote-code (models with their own code)",
    "ServeOptions.enforce_eager": "--enforce-eager: no graph capture",
    "ServeOptions.enable_expert_parallel": "--enable-expert-parallel: MoE experts spread over "
    "the DP x TP ranks",
    "ServeOptions.quantization": "--quantization (e.g. ascend for w8a8/w4a8 weights)",
    "ServeOptions.enable_prefix_caching": "--enable-prefix-caching / --no-enable-prefix-caching",
    "ServeOptions.enable_chunked_prefill": "--enable-chunked-prefill / --no-enable-chunked-prefill",
    "ServeOptions.compilation_config": "--compilation-config as a mapping (JSON on the line)",
    "ServeOptions.additional_config": "--additional-config for the vLLM-Ascend plugin (JSON)",
    "ServeOptions.kv_cache_memory_bytes": "--kv-cache-memory-bytes: fixed KV-cache size per "
    "device instead of gpu_memory_utilization (e.g. 16G)",
    "ServeOptions.env": "environment of these engines, over the top-level `env:`",
    # --- groups -------------------------------------------------------------------------------
    "Group.hosts": "hosts this group's engines run on, in placement order",
    "Group.instances": "independent engines (each with its own DP x TP ranks) in this group",
    "Group.dp": "data-parallel ranks of one instance",
    "Group.tp": "tensor-parallel size: devices one rank's weights are split over",
    "Group.pp": "pipeline-parallel size (devices a rank = tp x pp)",
    "Group.dp_rpc_port": "--data-parallel-rpc-port of the DP master",
    "Group.kv_port": "base KV port of the connectors that bind one (mooncake, "
    "mooncake_layerwise, nixl, sfa_d2h on decode); default: the connector's",
    "Group.kv_connectors": "KV connectors of these engines; two or more become a "
    "MultiConnector (e.g. [mooncake, ucm] or mooncake+ucm)",
    "Group.kv_role": "kv_producer / kv_consumer / kv_both (default: prefill produces, decode "
    "consumes, mixed both)",
    "Group.layerwise": "prefill's layer-by-layer KV offload through AscendStoreConnector",
    "Group.sparse_offload": "decode's sparse KV offload: full KV in host DRAM, a top-k buffer "
    "on the device",
    "Group.memfabric_protocol": "MemFabric transfer protocol of sfa_d2h (default: from the "
    "hardware: sdma on A3, device_urma on 950)",
    "Group.model_runner_v2": "run vLLM's Model Runner V2 (VLLM_USE_V2_MODEL_RUNNER=1); sparse "
    "offload refuses it",
    "Group.sfa_c8": "enable_sparse_sfa_c8 (int8 SFA KV); sparse offload refuses it",
    "Layerwise.backend": "KV pool backend of AscendStoreConnector",
    "Layerwise.use_layerwise": "offload layer by layer (false: whole requests)",
    "Layerwise.num_shared_buffers": "device buffers the layers reuse in turn (null: one per "
    "layer, no reuse)",
    "Layerwise.independent_layers": "layers that keep their own buffer (all: no reuse)",
    "Layerwise.prefetch_layers": "layers loaded ahead of the one computing",
    "SparseOffload.enabled": "turn the sparse KV offload on",
    "SparseOffload.dram_size_per_dp_gb": "host DRAM per DP rank that holds the full KV of every "
    "sequence (GB)",
    "SparseOffload.keep_device_kv_cache": "also keep the full KV on the device (debug only)",
    # --- proxy --------------------------------------------------------------------------------
    "Proxy.port": "port clients send requests to",
    "Proxy.flow": "prefill-first (prefill, then decode), layerwise (decode first, for "
    "layerwise connectors) or auto (from the connectors)",
    "Proxy.python": "python that runs vLLM-Ascend's proxy script (impl: vllm-ascend)",
    # --- bench --------------------------------------------------------------------------------
    "Bench.input_len": "prompt tokens of each request (vllm bench --random-input-len)",
    "Bench.output_len": "output tokens of each request (--random-output-len)",
    "Bench.num_prompts": "requests per run (--num-prompts)",
    "Bench.request_rate": "requests a second, or inf for all at once (--request-rate)",
    "Bench.max_concurrency": "requests in flight at most (--max-concurrency)",
    "Bench.seed": "dataset seed (--seed): the same prompts in every run",
    "Bench.ignore_eos": "generate output_len tokens even past end-of-sequence (--ignore-eos)",
    "Bench.prefix_ratio": "share of each prompt seeded first by the prefix protocol",
    "Bench.protocol": "plain: one run; prefix: seed prompt prefixes, then measure; twice: the "
    "same run cold then warm",
    "Bench.sweep": "lists to sweep over (cross product) instead of the single values",
    "BenchSweep.input_len": "input lengths to sweep",
    "BenchSweep.output_len": "output lengths to sweep",
    "BenchSweep.max_concurrency": "concurrencies to sweep",
    # --- KV services ----------------------------------------------------------------------------
    "KvServices.memcache": "memcache_hybrid: the MetaService kvpd starts and the LocalService "
    "config of every ascend_store rank",
    "KvServices.memfabric": "MemFabric library paths of sfa_d2h",
    "KvServices.mooncake": "the Mooncake master kvpd starts and the mooncake.json of the nodes",
    "KvServices.ucm": "UCM PipelineStore: a persistent prefix cache on shared storage",
    "KvServices.kvpd_store": "kvpd's own tiered prefix-cache store connector",
    "Memcache.config_store_port": "MetaService config-store port",
    "Memcache.metrics_port": "MetaService metrics/health HTTP port",
    "Memcache.lease_ttl_ms": "lease of a KV object in the MetaService (ms)",
    "Memcache.log_level": "MetaService and LocalService log level",
    "Memcache.world_size": "most LocalService ranks that may join (>= every TP x DP rank of the "
    "memcache users)",
    "Memcache.protocol": "transport: device_sdma (A3 HCCS), device_rdma (A2), device_urma/"
    "device_uboe (950), host_* through host memory",
    "Memcache.python": "python that runs the MetaService",
    "Memfabric.set_env": "scripts sourced before the sfa_d2h engines",
    "Mooncake.host": "host that runs mooncake_master",
    "Mooncake.port": "master RPC port",
    "Mooncake.metrics_port": "master metrics/admin HTTP port",
    "Mooncake.http_metadata_port": "HTTP metadata server port (unset: none)",
    "Mooncake.eviction_high_watermark_ratio": "pool fill ratio at which eviction starts",
    "Mooncake.eviction_ratio": "share of the pool evicted at a time",
    "Mooncake.default_kv_lease_ttl": "lease of a KV object in the master (ms)",
    "Mooncake.extra_args": "more mooncake_master arguments, verbatim",
    "Mooncake.metadata_server": "metadata_server of mooncake.json (P2PHANDSHAKE: none)",
    "Mooncake.protocol": "transfer protocol of mooncake.json (ascend on NPUs, tcp, rdma)",
    "Mooncake.device_name": "device_name of mooncake.json (RDMA NICs; empty: automatic)",
    "Mooncake.global_segment_size": "memory each node contributes to the pool (e.g. 1GB)",
    "Mooncake.ld_library_path": "prepended to LD_LIBRARY_PATH of mooncake_master",
    "Mooncake.binary": "the mooncake_master command",
    "UCM.connector": "UCM store class",
    "UCM.pipeline": "store pipeline (Cache|Posix: DRAM cache over a POSIX directory)",
    "UCM.cache_buffer_capacity_gb": "DRAM cache buffer per instance (GB)",
    "UCM.enable_event_sync": "event-based sync of the cache transfers",
    "UCM.use_layerwise": "load and save KV layer by layer",
    "KvpdStore.path": "directory of the store's disk tier (shared by the engines)",
    "KvpdStore.dram_cache_gb": "DRAM tier per engine (GB; 0: disk only)",
    "KvpdStore.capacity_gb": "most disk the store uses (GB; unset: unbounded)",
    "KvpdStore.io_threads": "threads that read and write the disk tier",
}
