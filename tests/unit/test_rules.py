"""Every rule: a bundled profile changed to violate it, and the message the user gets."""

from __future__ import annotations

import json

import pytest

from kvpd.errors import ProfileError
from kvpd.plan.build import load_plan
from kvpd.plan.value import Plan
from kvpd.profile.load import parse_profile

LW = "layerwise-sparse-1p1d"


def plan(name: str, *sets: str) -> Plan:
    return load_plan(name, sets=list(sets), base_dir="/srv/kvpd")


def error(name: str, *sets: str) -> str:
    with pytest.raises(ProfileError) as e:
        plan(name, *sets)
    return str(e.value)


def warnings(name: str, *sets: str) -> str:
    return "\n".join(plan(name, *sets).warnings)


def file(p: Plan, host: str, path: str) -> str:
    return next(f.content for f in p.files if f.host == host and f.path == path)


def kv_config(p: Plan, proc: str) -> dict:
    argv = p.process(proc).command
    return json.loads(argv[argv.index("--kv-transfer-config") + 1])


# --- schema and YAML ----------------------------------------------------------------------------


def test_unknown_key_names_field_line_and_suggestion() -> None:
    text = "name: x\nhosts:\n  h: {address: 1.2.3.4}\nmodel:\n  path: /m\n  max_modle_len: 5\n"
    with pytest.raises(ProfileError) as e:
        parse_profile(text, "p.yaml")
    assert (
        "p.yaml:6: model.max_modle_len: unknown field 'max_modle_len'. Did you mean "
        "'max_model_len'?" in str(e.value)
    )


def test_bad_value_names_field_and_line() -> None:
    text = "name: x\nhosts:\n  h: {address: 1.2.3.4}\nmodel: {path: /m}\nhardware: a9\n"
    with pytest.raises(ProfileError) as e:
        parse_profile(text, "p.yaml")
    assert (
        "p.yaml:5: hardware: hardware must be one of 'a2', 'a3', '950', 'cuda' or 'cpu', "
        "not 'a9'. Pick one of them."
    ) in str(e.value)


def test_yaml_syntax_error_has_line() -> None:
    with pytest.raises(ProfileError) as e:
        parse_profile("name: x\nhosts: [\n", "p.yaml")
    assert "p.yaml:" in str(e.value)
    assert "not valid YAML" in str(e.value)


def test_duplicate_key() -> None:
    with pytest.raises(ProfileError) as e:
        parse_profile("name: x\nname: y\n", "p.yaml")
    assert "p.yaml:2: name: key appears twice" in str(e.value)


def test_all_problems_reported_at_once() -> None:
    msg = error(LW, "prefill.tp=8", "decode.sparse_offload.topk_buffer_size=1000")
    assert "problems" in msg
    assert "prefill.tp" in msg
    assert "topk_buffer_size" in msg


def test_unknown_profile_lists_bundled() -> None:
    with pytest.raises(ProfileError, match="Bundled profiles: .*local"):
        plan("no-such-profile")


# --- topology ------------------------------------------------------------------------------------


def test_unknown_host_with_suggestion() -> None:
    msg = error(LW, "prefill.hosts=[p2]")
    assert "prefill.hosts[0]: unknown host 'p2'. Did you mean 'p1'?" in msg


def test_prefill_tp_smaller_than_decode() -> None:
    assert "prefill tp 8 must be >= decode tp 16" in error(LW, "prefill.tp=8")


def test_prefill_tp_not_divisible_by_decode() -> None:
    msg = error(LW, "prefill.tp=12", "decode.tp=8")
    assert "prefill tp 12 must be >= decode tp 8 and divisible by it" in msg


def test_dp_size_local_times_tp_exceeds_devices() -> None:
    msg = error("large-ep", "decode.dp_size_local=4")
    assert "dp_size_local 4 x tp 4 x pp 1 = 16 devices per host, but 'd1' has 8" in msg


def test_dp_not_multiple_of_dp_size_local() -> None:
    assert "dp 7 is not a multiple of dp_size_local 2" in error("large-ep", "decode.dp=7")


def test_not_enough_devices() -> None:
    assert "prefill needs 48 devices" in error("large-ep", "prefill.dp=6")


def test_every_dp_rank_exactly_once() -> None:
    p = plan("large-ep")
    ranks = sorted(r for x in p.processes if x.role == "decode" for r in _dp_rank(x))
    assert ranks == list(range(8))
    starts = {x.host: _dp_rank(x) for x in p.processes if x.role == "decode" and x.ports[0] == 9000}
    assert starts == {"d1": [0], "d2": [2], "d3": [4], "d4": [6]}  # the guide's dp_rank_start
    assert p.process("decode-dp3").devices == (4, 5, 6, 7)


def _dp_rank(x) -> list[int]:
    argv = list(x.command)
    return [int(argv[argv.index("--data-parallel-rank") + 1])]


def test_p_without_d() -> None:
    assert "`prefill:` without `decode:`" in error(LW, "decode=null", "proxy=null")


# --- ports -----------------------------------------------------------------------------------


def test_decode_kv_ports_above_65535() -> None:
    msg = error(LW, "decode.kv_port=65530")
    assert (
        "decode.kv_port: 10 ports in 65536-65545 of decode-0 lie above 65535 (ports are "
        "decode.kv_port plus an offset per process and rank). Lower decode.kv_port by at "
        "least 10."
    ) in msg
    assert "problems" not in msg  # ten ports, one problem, one message


def test_port_clash_names_both_owners() -> None:
    msg = error(LW, "decode.port=20055")
    assert "port 20055 on host 'd1' is used twice: decode-0 (" in msg


def test_decode_kv_port_range_reserved() -> None:
    p = plan(LW)
    used = sorted(u.port for u in p.ports if u.owner == "decode-0" and "kv_port" in u.purpose)
    assert used == list(range(20050, 20050 + 16))  # dp x tp consecutive ports from kv_port


def test_mooncake_ports_spaced_by_tp_on_one_host() -> None:
    p = plan("ucm-mooncake-2p2d")
    mooncake = kv_config(p, "prefill-1")["kv_connector_extra_config"]["connectors"][0]
    assert mooncake["kv_port"] == 20005


def test_adxl_range_warning() -> None:
    assert "Ascend's direct transport picks random ports" in warnings("ucm-mooncake-2p2d")
    assert "random ports" not in warnings(
        "ucm-mooncake-2p2d", "prefill.kv_port=30000", "decode.kv_port=30000"
    )


# --- layerwise prefill offload -------------------------------------------------------------------


def test_layerwise_needs_memcache() -> None:
    assert "needs the memcache MetaService" in error(LW, "kv.memcache=null")


def test_layerwise_needs_use_layerwise() -> None:
    assert "needs backend memcache and use_layerwise: true" in error(
        LW, "prefill.layerwise.use_layerwise=false"
    )


def test_layerwise_needs_eager() -> None:
    assert "requires eager mode" in error(LW, "prefill.enforce_eager=false")


def test_layerwise_sets_eager_by_default() -> None:
    assert "--enforce-eager" in plan(LW).process("prefill-0").command


def test_layerwise_needs_mla_model() -> None:
    assert "needs an MLA, SFA or DSA attention model, not gqa" in error(
        LW, "model.attention=gqa", "model.kv_heads=8", "model.head_dim=128"
    )


def test_independent_layers_range() -> None:
    assert "layer index 100 is out of range for a model with 78 layers" in error(
        LW, "prefill.layerwise.independent_layers=[0, 100]"
    )


def test_independent_layers_all_is_accepted_with_warning() -> None:
    w = warnings(LW, "prefill.layerwise.independent_layers=ALL")
    assert "disables buffer reuse" in w


def test_no_mooncake_layerwise_with_reuse() -> None:
    msg = error(
        LW,
        "prefill.kv_connectors=[mooncake_layerwise, ascend_store]",
        "kv.mooncake={host: p1}",
        "decode.kv_connectors=[sfa_d2h]",
    )
    assert "MooncakeLayerwiseConnector cannot be combined with layerwise buffer reuse" in msg


# --- sparse decode offload -----------------------------------------------------------------------


def test_topk_buffer_smaller_than_index_topk() -> None:
    assert "1024 is smaller than index_topk 2048" in error(
        LW, "decode.sparse_offload.topk_buffer_size=1024"
    )


def test_topk_buffer_not_divisible_by_block() -> None:
    assert "4100 is not divisible by block_size 128; use 4224" in error(
        LW, "decode.sparse_offload.topk_buffer_size=4100"
    )


def test_sparse_only_on_decode() -> None:
    assert "runs only on decode" in error(LW, "prefill.sparse_offload={topk_buffer_size: 4096}")


def test_sparse_needs_consumer() -> None:
    assert "needs decode with kv_role kv_consumer" in error(LW, "decode.kv_role=kv_both")


def test_sparse_no_cp_no_pp() -> None:
    assert "does not support context parallel" in error(LW, "decode.cp=2")
    assert "does not support pipeline parallel" in error(LW, "decode.pp=2")


def test_sparse_only_sparse_attention_models() -> None:
    assert "only for sparse-attention models" in error(LW, "model.index_topk=null")


def test_sparse_dram_must_hold_kv() -> None:
    assert "1 GB cannot hold the full KV cache" in error(
        LW, "decode.sparse_offload.dram_size_per_dp_gb=1"
    )


def test_decode_sfa_needs_sparse_enabled() -> None:
    assert "runs with sparse KV offload enabled" in error(LW, "decode.sparse_offload=null")


# --- MemFabric -----------------------------------------------------------------------------------


def test_memfabric_protocol_must_fit_hardware() -> None:
    assert "memfabric protocol device_urma is not valid on a3 (use sdma or device_rdma)" in error(
        LW, "prefill.memfabric_protocol=device_urma", "decode.memfabric_protocol=device_urma"
    )


def test_memfabric_protocol_identical_on_p_and_d() -> None:
    assert "memfabric protocols differ (prefill sdma, decode device_rdma)" in error(
        LW, "decode.memfabric_protocol=device_rdma"
    )


def test_950_renders_device_urma_on_both_sides() -> None:
    p = plan(LW, "hardware=950", "kv.memcache.protocol=device_urma")
    pre = kv_config(p, "prefill-0")["kv_connector_extra_config"]["connectors"][0]
    dec = kv_config(p, "decode-0")
    assert pre["kv_connector_extra_config"]["memfabric_transfer_protocol"] == "device_urma"
    assert dec["kv_connector_extra_config"]["memfabric_transfer_protocol"] == "device_urma"


def test_sparse_offload_unsupported_on_a2() -> None:
    assert "supported on A3 and 950 only; host 'p1' is a2" in error(
        LW, "hardware=a2", "kv.memcache.protocol=device_rdma"
    )


# --- memcache ------------------------------------------------------------------------------------


def test_mmc_files_share_urls() -> None:
    p = plan(LW)
    meta = file(p, "p1", "conf/mmc-meta.conf")
    local = file(p, "p1", "conf/mmc-local.conf")
    assert "ock.mmc.meta_service_url = tcp://192.168.20.1:5000" in meta
    assert "ock.mmc.meta_service_url = tcp://192.168.20.1:5000" in local
    assert "ock.mmc.meta_service.config_store_url = tcp://192.168.20.1:6000" in meta
    assert "ock.mmc.local_service.config_store_url = tcp://192.168.20.1:6000" in local


def test_world_size_covers_local_ranks() -> None:
    assert "world_size 8 is below the 16 LocalService ranks" in error(
        LW, "kv.memcache.world_size=8"
    )


def test_dram_size_rounded_up_to_gib() -> None:
    p = plan(LW, "kv.memcache.dram_size=1.5GB")
    assert "ock.mmc.local_service.dram.size = 2GB" in file(p, "p1", "conf/mmc-local.conf")
    assert "1.5GB is rounded up to 2GB" in "\n".join(p.warnings)


def test_dram_size_auto_from_model_facts() -> None:
    # 78 layers x (512 + 64) x 2 B = 89,856 B/token; 32768 tokens x 16 prompts / 16 ranks
    p = plan(LW, "kv.memcache.dram_size=auto")
    assert "dram.size = 3GB" in file(p, "p1", "conf/mmc-local.conf")


def test_memcache_protocol_must_fit_hardware() -> None:
    assert "protocol device_rdma does not match a3 hardware" in error(
        LW, "kv.memcache.protocol=device_rdma"
    )


def test_bad_dram_size() -> None:
    assert "'ten' is not a size" in error(LW, "kv.memcache.dram_size=ten")


# --- Mooncake ------------------------------------------------------------------------------------


def test_mooncake_sizes_equal_real_groups() -> None:
    p = plan("large-ep")
    cfg = kv_config(p, "decode-dp5")["kv_connector_extra_config"]
    assert cfg == {"prefill": {"dp_size": 4, "tp_size": 8}, "decode": {"dp_size": 8, "tp_size": 4}}
    four = plan("large-ep", "decode.dp=4", "decode.hosts=[d1, d2]")
    cfg = kv_config(four, "decode-dp3")["kv_connector_extra_config"]
    assert cfg["decode"] == {"dp_size": 4, "tp_size": 4}


def test_mooncake_master_address_matches_master() -> None:
    p = plan("ucm-mooncake-2p2d", "kv.mooncake.port=50099")
    doc = json.loads(file(p, "d1", "conf/mooncake.json"))
    assert doc["master_server_address"] == "192.168.10.1:50099"
    assert "50099" in p.process("mooncake-master").command


def test_mooncake_segment_size_units() -> None:
    assert "'1G': use a size with unit GB" in error(
        "ucm-mooncake-2p2d", "kv.mooncake.global_segment_size=1G"
    )


def test_mooncake_needs_master() -> None:
    assert "mooncake needs the master" in error("ucm-mooncake-2p2d", "kv.mooncake=null")


# --- consistency between P and D -----------------------------------------------------------------


def test_same_block_size() -> None:
    assert "KV blocks must have the same size on both sides" in error(
        "ucm-mooncake-2p2d", "decode.block_size=64"
    )


def test_same_hash_seed() -> None:
    assert "PYTHONHASHSEED differs between groups (prefill 0, decode 1)" in error(
        "ucm-mooncake-2p2d", "decode.env={PYTHONHASHSEED: '1'}"
    )


# --- UCM -----------------------------------------------------------------------------------------


def test_ucm_storage_must_be_shared_across_hosts() -> None:
    assert "its storage is not shared" in error("ucm-centralized-2p2d", "kv.ucm.shared=false")
    assert "must be one shared filesystem" in warnings("ucm-centralized-2p2d", "kv.ucm.shared=null")


def test_ucm_never_hit_ratio() -> None:
    assert "mock connector" in error("ucm-centralized-2p2d", "kv.ucm.config={hit_ratio: 0.5}")


def test_ucm_single_connector_entry() -> None:
    text = file(plan("ucm-centralized-2p2d"), "p1", "conf/ucm.yaml")
    import yaml

    doc = yaml.safe_load(text)
    assert len(doc["ucm_connectors"]) == 1
    assert doc["ucm_connectors"][0]["ucm_connector_config"]["storage_backends"] == "/mnt/test1"


def test_ucm_nfs_store_without_event_sync() -> None:
    assert "must be false with UcmNfsStore" in error(
        "ucm-centralized-2p2d", "kv.ucm.connector=UcmNfsStore"
    )


# --- hardware, proxy, bench ----------------------------------------------------------------------


def test_ascend_only_connector_on_cpu() -> None:
    assert "ucm runs only on Ascend hosts" in error(
        "local", "prefill.kv_connectors=[ucm]", "kv.ucm={storage: /tmp/x}"
    )


def test_layerwise_proxy_needs_reachable_address() -> None:
    assert "0.0.0.0 is not one" in error(LW, "proxy.bind=0.0.0.0")


def test_pd_needs_proxy() -> None:
    assert "P/D needs a proxy" in error("local", "proxy=null")


def test_bench_longer_than_max_model_len_warns() -> None:
    assert "exceed max_model_len 512" in warnings("local", "bench.input_len=600")


def test_guide_32k_against_max_model_len_17000_names_both_fixes() -> None:
    """large-ep benches the guide's 32k prompts; its engines serve --max-model-len 17000."""
    w = warnings("large-ep")
    assert "input 32000 + output 1000 tokens exceed max_model_len 17000" in w
    assert "--set bench.input_len=16000" in w
    assert "--set model.max_model_len=33000" in w
    assert "exceed" not in warnings("large-ep", "bench.input_len=16000")
    assert "exceed" not in warnings("large-ep", "model.max_model_len=33000")


def test_scenario_without_unknown_connector_and_external_without_store() -> None:
    msg = error("ucm-mooncake-2p2d", "bench.scenarios.x={without: [kvpd_store]}")
    assert "bench.scenarios.x.without: scenario 'x' detaches kvpd_store, which no group" in msg
    assert "Remove it from `without`" in msg
    msg = error("ucm-mooncake-2p2d", "bench.scenarios.x={without: [ucm], cache: external}")
    assert "bench.scenarios.x.cache: scenario 'x' expects external prefix-cache hits" in msg
    assert "set cache: hbm or none" in msg
    msg = error("ucm-mooncake-2p2d", "bench.scenarios.x={cache: some}")
    assert "bench.scenarios.x" in msg
    assert "cache" in msg


def test_ucm_profiles_carry_the_guides_three_scenarios() -> None:
    for name in ("large-ep", "ucm-mooncake-2p2d", "ucm-pd-mixed"):
        s = plan(name).bench.scenarios
        assert {k: (v.without, v.cache) for k, v in s.items()} == {
            "recompute": (("ucm",), "none"),
            "hbm": (("ucm",), "hbm"),
            "ucm": ((), "external"),
        }


def test_nixl_on_cpu_gets_side_channel_ports_and_ucx_env() -> None:
    p = plan("local", "prefill.kv_connectors=[nixl]", "decode.kv_connectors=[nixl]")
    pre, dec = dict(p.process("prefill-0").env), dict(p.process("decode-0").env)
    assert pre["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5600"
    assert dec["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5700"
    assert pre["UCX_TLS"] == "tcp,sm,self"
    assert pre["UCX_NET_DEVICES"] == "lo"
    assert kv_config(p, "prefill-0") == {
        "kv_connector": "NixlConnector",
        "kv_role": "kv_producer",
        "kv_buffer_device": "cpu",
    }


def test_nixl_side_channel_clash_is_reported() -> None:
    msg = error(
        "local",
        "prefill.kv_connectors=[nixl]",
        "decode.kv_connectors=[nixl]",
        "decode.kv_port=5600",
    )  # the prefill's default
    assert "port 5600 on host 'localhost' is used twice" in msg


def test_secrets_are_in_the_launch_script_but_never_serialised() -> None:
    p = plan("local", "env.OPENAI_API_KEY=sk-very-secret", "proxy.port=18001",
             "proxy.client_key_file=/srv/kvpd/client-key")  # fmt: skip
    script = file(p, "localhost", "proxy/launch.sh")
    assert "sk-very-secret" in script  # the process needs it
    assert next(f.mode for f in p.files if f.path == "proxy/launch.sh") == 0o700
    assert "sk-very-secret" not in p.to_json()  # plan.json, --json and state.json
    assert dict(p.process("proxy").env)["OPENAI_API_KEY"] == "****"
    assert "sk-very-secret" not in repr(p)


def test_engines_bind_their_hosts_cluster_address_by_default() -> None:
    """Not 0.0.0.0: every other network of the host (a public one, a container bridge) would
    reach the engine's API. `engine.host` still chooses another address."""
    p = plan("layerwise-sparse-1p1d")
    for name, address in (("prefill-0", "192.168.20.1"), ("decode-0", "192.168.20.2")):
        argv = p.process(name).command
        assert argv[argv.index("--host") + 1] == address
    argv = plan("layerwise-sparse-1p1d", "engine.host=0.0.0.0").process("decode-0").command
    assert argv[argv.index("--host") + 1] == "0.0.0.0"


def test_dev_shm_is_required_only_for_ucm_share_buffers_per_dp_rank() -> None:
    """UCM's cache buffer is a /dev/shm file only with share_buffer_enable (default: MLA
    models), one per DP instance (kv-stores.md)."""

    def shm(name: str, *sets: str) -> dict[str, float]:
        return {h: r.shm_gb for h, r in plan(name, *sets).requirements.items() if r.shm_gb}

    # GLM-5.1 (DSA, an MLA model): 64 GiB per prefill DP rank, one rank per node
    assert shm("large-ep") == {"p1": 64.0, "p2": 64.0, "p3": 64.0, "p4": 64.0}
    assert shm("large-ep", "kv.ucm.config={share_buffer_enable: false}") == {}
    # QwQ-32B (GQA): the buffer is not shared memory unless asked; then per DP rank (DP2)
    assert shm("ucm-pd-mixed") == {}
    assert shm("ucm-pd-mixed", "kv.ucm.config={share_buffer_enable: true}") == {"n1": 128.0}


def test_ucm_yaml_stays_in_the_run_dir_unless_the_profile_says_otherwise() -> None:
    p = plan("ucm-mooncake-2p2d")
    ucm_files = [f.path for f in p.files if f.template == "ucm.yaml"]
    assert ucm_files
    assert all(not f.startswith("/") for f in ucm_files)
    assert "UCM ships" not in warnings("ucm-mooncake-2p2d")
    example = "/vllm-workspace/unified-cache-management/examples/ucm_config_example.yaml"
    w = warnings("ucm-mooncake-2p2d", f"kv.ucm.config_file={example}")
    assert f"kv.ucm.config_file: kvpd writes the UCM yaml to {example}" in w
    assert "Leave config_file unset" in w


def test_proxy_timeouts_render_what_the_profile_sets_and_default_to_no_limit() -> None:
    from kvpd.proxy.config import ProxyConfig, parse_args

    cmd = plan("large-ep").process("proxy").command
    assert not any(a.endswith("-timeout") for a in cmd)  # the proxy's own defaults
    d = ProxyConfig()
    # no limit for the prefill answer and a decoder's first byte (the guide's 128k rows have a
    # mean TTFT of 268 s); only the silence between stream chunks is bounded
    assert (d.prefill_timeout, d.first_byte_timeout, d.read_timeout) == (0.0, 0.0, 300.0)
    cmd = plan("large-ep", "proxy.prefill_timeout_s=900", "proxy.first_byte_timeout_s=1200",
               "proxy.read_timeout_s=60.5").process("proxy").command  # fmt: skip
    i = cmd.index("--prefill-timeout")
    assert cmd[i : i + 6] == ("--prefill-timeout", "900", "--first-byte-timeout", "1200",
                              "--read-timeout", "60.5")  # fmt: skip
    hosts = ["--prefiller-hosts", "127.0.0.1", "--prefiller-ports", "8001"]
    hosts += ["--decoder-hosts", "127.0.0.1", "--decoder-ports", "8002"]
    cfg = parse_args([*hosts, *cmd[i : i + 6]])
    assert (cfg.prefill_timeout, cfg.first_byte_timeout, cfg.read_timeout) == (900, 1200, 60.5)


def test_proxy_timeouts_are_refused_for_vllm_ascends_proxy_and_when_not_positive() -> None:
    msg = error("large-ep", "proxy.impl=vllm-ascend", "proxy.prefill_timeout_s=600")
    assert "proxy.prefill_timeout_s: vLLM-Ascend's example proxy has no timeout options" in msg
    assert "use kvpd's proxy (impl: kvpd)" in msg
    assert "proxy.read_timeout_s" in error("large-ep", "proxy.read_timeout_s=0")


def test_health_timeouts_per_group_default_sized_from_the_sparse_pool() -> None:
    def timeouts(*sets: str) -> dict[str, float]:
        p = plan(LW, *sets)
        return {x.name: x.health.timeout_s for x in p.processes if x.health}

    t = timeouts()
    # decode allocates dram_size_per_dp_gb 128 for its one DP rank before /health answers
    assert t["prefill-0"] == 1800
    assert t["decode-0"] == 1800 + 20 * 128
    assert timeouts("decode.health_timeout_s=7200")["decode-0"] == 7200
    assert timeouts("runtime.health_timeout_s=900")["decode-0"] == 900 + 20 * 128
    assert timeouts("prefill.health_timeout_s=60")["prefill-0"] == 60
    assert "decode.health_timeout_s" in error(LW, "decode.health_timeout_s=0")


def test_log_name_names_the_engine_logs_like_the_guide() -> None:
    p = plan("large-ep")
    logs = {x.name: x.log for x in p.processes}
    assert logs["prefill-dp2"] == "logs/prefiller_dp_2.log"
    assert logs["decode-dp7"] == "logs/decoder_dp_7.log"
    assert logs["proxy"] == "logs/proxy.log"
    assert plan("local").process("prefill-0").log == ("logs/prefill-0.log")
    script = next(f.content for f in p.files if f.path == "prefill-dp2/launch.sh")
    assert "logs/prefiller_dp_2.log" in script


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("x{foo}.log", "prefill.log_name: 'x{foo}.log' uses {foo}; the placeholders are {name}"),
        ("a/b.log", "prefill.log_name: 'a/b.log' must be a file name"),
        ("x{.log", "is not a valid template"),
    ],
)
def test_bad_log_name_templates(value: str, message: str) -> None:
    assert message in error("large-ep", f"prefill.log_name={value}")


def test_log_name_must_give_each_process_its_own_file() -> None:
    msg = error("large-ep", "decode.log_name=decoder.log")
    assert "decode-dp0 and decode-dp1 on d1 would both write logs/decoder.log" in msg
    assert "put {dp_rank} or {name} into log_name" in msg


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("2", "lease_s must be at least 3, not 2. Set it to at least 3."),
        ("7200", "lease_s must be at most 3600, not 7200. Set it to at most 3600."),
        ("abc", "lease_s must be a whole number, not 'abc'. Set it to a whole number."),
    ],
)
def test_lease_time_to_live_is_bounded(value: str, why: str) -> None:
    # Under 3 s a renewal every third of it could not reach a host behind a bastion in time;
    # over an hour a killed kvpd would hold the deployment for longer than anyone waits.
    msg = error("local", f"runtime.lease_s={value}")
    assert "runtime.lease_s:" in msg, msg
    assert why in msg, msg
