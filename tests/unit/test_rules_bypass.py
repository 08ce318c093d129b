"""Missing and bypassable rules: each rule gets a failing profile (a bundled profile
changed to break it) and the message it gets, which names the field and says how to fix it."""

from __future__ import annotations

import pytest

from kvpd.plan.build import load_plan
from tests.unit.test_rules import LW, error, plan, warnings

MC = "ucm-mooncake-2p2d"
UCM = "ucm-centralized-2p2d"
MIXED = "ucm-pd-mixed"


# --- extra args cannot bypass what kvpd derives or checks ---


@pytest.mark.parametrize(
    ("args", "use"),
    [
        ("[--block-size, '64']", "set block_size (engine: or the group) instead"),
        ("[--tensor-parallel-size, '2']", "set the group's tp instead"),
        ("[-tp, '2']", "set the group's tp instead"),
        ("[--model, /other]", "set model.path instead"),
        ("[--port=9100]", "set the group's port instead"),
        ("['--kv-transfer-config', '{}']", "set the group's kv_connectors and kv.* settings"),
        ("[--data-parallel-rank, '1']", "set the group's dp_launch: per_rank"),
    ],
)
def test_managed_flags_are_refused_in_args(args: str, use: str) -> None:
    msg = error(LW, f"decode.args={args}")
    assert "decode.args[0]: " in msg
    assert "is set by kvpd from the profile" in msg
    assert use in msg


@pytest.mark.parametrize(
    ("args", "shown", "use"),
    [
        # vLLM turns `_` into `-` in a flag's name, with or without `=value`
        ("[--tensor_parallel_size, '2']", "--tensor-parallel-size", "the group's tp"),
        ("[--block_size=64]", "--block-size", "block_size"),
        ("['--kv_transfer_config={}']", "--kv-transfer-config", "kv_connectors"),
        # one key of a JSON-valued flag
        (
            "['--compilation-config.cudagraph_mode=NONE']",
            "--compilation-config",
            "compilation_config",
        ),
        ("['--kv-transfer-config.kv_role=kv_both']", "--kv-transfer-config", "kv_connectors"),
        # -O with its value attached
        ("[-O3]", "-O", "compilation_config"),
        ("['-O.cudagraph_mode=NONE']", "-O", "compilation_config"),
        # argparse expands unambiguous prefixes (allow_abbrev is on in vLLM's parser)
        (
            "[--tensor-parallel, '2']",
            "--tensor-parallel (vLLM reads it as --tensor-parallel-size)",
            "tp",
        ),
        ("[--max-model, '8']", "--max-model (vLLM reads it as --max-model-len)", "max_model_len"),
        # the negative form of a boolean flag kvpd sets
        (
            "[--no-enforce-eager]",
            "--no-enforce-eager (vLLM reads it as --enforce-eager)",
            "enforce_eager",
        ),
        (
            "[--no-trust_remote_code]",
            "--no-trust-remote-code (vLLM reads it as --trust-remote-code)",
            "trust_remote_code",
        ),
    ],
)
def test_managed_flags_are_refused_in_every_spelling_vllm_reads(
    args: str, shown: str, use: str
) -> None:
    msg = error(LW, f"decode.args={args}")
    assert f"decode.args[0]: {shown} is set by kvpd from the profile" in msg, msg
    assert use in msg


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ("[--config, /tmp/more.yaml]", "--config in args reads more options from a YAML file"),
        ("[--config=/tmp/more.yaml]", "--config in args reads more options from a YAML file"),
        ("[--api-key, s3cret]", "set VLLM_API_KEY in the group's env instead"),
        ("[--api_key=s3cret]", "set VLLM_API_KEY in the group's env instead"),
    ],
)
def test_flags_that_hide_options_or_secrets_are_refused(args: str, says: str) -> None:
    msg = error(LW, f"decode.args={args}")
    assert "decode.args[0]: " in msg, msg
    assert says in msg, msg
    assert "s3cret" not in msg  # the refusal does not print the secret either


def test_a_flag_and_its_value_in_one_entry_is_refused() -> None:
    msg = error(LW, "decode.args=['--block-size 64']")
    assert "decode.args[0]: '--block-size 64' holds a space in a flag" in msg
    assert "two list entries" in msg


@pytest.mark.parametrize("args", ["[--dtype, float16]", "[--dtype=half]", "[--dtype, auto]"])
def test_dtype_in_args_must_agree_with_the_model(args: str) -> None:
    msg = error(LW, f"decode.args={args}")
    assert "decode.args: --dtype " in msg, msg
    assert "contradicts model.dtype bfloat16" in msg, msg


def test_dtype_in_args_that_agrees_with_the_model_passes() -> None:
    p = plan(LW, "decode.args=[--dtype, bfloat16]")
    assert "bfloat16" in p.process("decode-0").command


def test_kv_cache_dtype_under_sparse_offload_is_found_in_any_spelling() -> None:
    assert "requires a BF16 main cache; --kv-cache-dtype fp8" in error(
        LW, "decode.args=[--kv_cache_dtype=fp8]"
    )


def test_unmanaged_flags_and_values_that_look_like_flags_pass() -> None:
    # a value of -1, a real flag that shares a first word with a managed one, a `.` in a value
    args = "[--max-loras, '-1', --enable-prompt-tokens-details, --tokenizer, ./tok.v2]"
    cmd = plan(LW, f"decode.args={args}").process("decode-0").command
    assert "--enable-prompt-tokens-details" in cmd
    assert "./tok.v2" in cmd
    assert "-1" in cmd


def test_engine_args_are_checked_too() -> None:
    assert "engine.args[1]: --max-model-len is set by kvpd" in error(
        LW, "engine.args=[--disable-log-stats, --max-model-len, '8']"
    )


def test_other_args_pass_verbatim() -> None:
    p = plan(LW, "decode.args=[--disable-log-stats]")
    assert "--disable-log-stats" in p.process("decode-0").command


def test_sparse_config_in_additional_config_is_refused() -> None:
    msg = error(LW, "decode.additional_config={sparse_kv_offload_config: {enabled: true}}")
    assert (
        "decode.additional_config.sparse_kv_offload_config: sparse_kv_offload_config is "
        "written by kvpd (and checked); remove it and set the decode group's "
        "sparse_offload instead." in msg
    )


@pytest.mark.parametrize(
    "name", ["MMC_LOCAL_CONFIG_PATH", "ASCEND_RT_VISIBLE_DEVICES", "MOONCAKE_CONFIG_PATH"]
)
def test_managed_env_is_refused(name: str) -> None:
    assert f"env.{name}: {name} is set by kvpd for each process" in error(LW, f"env={{{name}: x}}")


# --- memcache pass-through maps ---


@pytest.mark.parametrize(
    ("field", "key", "use"),
    [
        ("local_extra", "ock.mmc.meta_service_url", "kv.memcache.host and kv.memcache.port"),
        ("local_extra", "ock.mmc.local_service.world_size", "kv.memcache.world_size"),
        ("meta_extra", "ock.mmc.meta_service.config_store_url", "kv.memcache.config_store_port"),
        ("local_extra", "ock.mmc.local_service.dram.size", "kv.memcache.dram_size"),
    ],
)
def test_memcache_extra_cannot_repeat_managed_keys(field: str, key: str, use: str) -> None:
    msg = error(LW, f'kv.memcache.{field}={{"{key}": "1"}}')
    assert f"kv.memcache.{field}.{key}: {key} is written by kvpd" in msg
    assert use in msg


@pytest.mark.parametrize(
    "key", ["OCK.MMC.META_SERVICE_URL", "ock.mmc.meta_service_url ", " Ock.mmc.meta_service_url"]
)
def test_a_managed_memcache_key_in_other_case_or_with_spaces_is_named(key: str) -> None:
    msg = error(LW, f'kv.memcache.local_extra={{"{key}": "tcp://10.0.0.9:5000"}}')
    assert f"{key!r} is 'ock.mmc.meta_service_url' in other case or with spaces" in msg, msg
    assert "remove it and set kv.memcache.host and kv.memcache.port instead" in msg


def test_unknown_memcache_key_is_refused_with_suggestion() -> None:
    msg = error(LW, 'kv.memcache.meta_extra={"ock.mmc.evict_threshold_hig": "90"}')
    assert "is not a memcache 1.3 key of mmc-meta.conf" in msg
    assert "Did you mean 'ock.mmc.evict_threshold_high'?" in msg


def test_memcache_key_in_the_wrong_file() -> None:
    msg = error(LW, 'kv.memcache.meta_extra={"ock.mmc.client.timeout.seconds": "5"}')
    assert (
        "belongs in the other memcache file, not mmc-meta.conf; move it to "
        "kv.memcache.local_extra" in msg
    )


def test_known_memcache_keys_are_written() -> None:
    p = plan(LW, 'kv.memcache.local_extra={"ock.mmc.client.timeout.seconds": "5"}')
    text = next(f.content for f in p.files if f.path == "conf/mmc-local.conf")
    assert "ock.mmc.client.timeout.seconds = 5\n" in text


def test_memcache_evict_thresholds() -> None:
    msg = error(
        LW,
        'kv.memcache.meta_extra={"ock.mmc.evict_threshold_high": "60", '
        '"ock.mmc.evict_threshold_low": "70"}',
    )
    assert "memcache needs 1 <= low < high <= 99" in msg


def test_memcache_lru_shards_power_of_two() -> None:
    assert "'3' is not a power of two in [1, 1024]" in error(
        LW, 'kv.memcache.meta_extra={"ock.mmc.meta_service.lru_shard_count": "3"}'
    )


def test_memcache_dram_below_sizing_formula_warns() -> None:
    w = warnings(LW, "kv.memcache.dram_size=1GB")
    assert "kv.memcache.dram_size: 1GB per rank is below the guide's sizing (3GB" in w


# --- cross-role combinations the guides forbid ---


def test_sfa_consumer_without_producer() -> None:
    msg = error(LW, "prefill.kv_connectors=[ascend_store]")
    assert (
        "prefill.kv_connectors: decode consumes KV through sfa_d2h, but prefill has no "
        "sfa_d2h producer"
    ) in msg


def test_prefill_first_proxy_in_sfa_deployment() -> None:
    msg = error(LW, "proxy.flow=prefill-first")
    assert "proxy.flow: SfaRemoteD2H deployments need the decode-first layerwise proxy" in msg


def test_layerwise_proxy_without_a_layerwise_decode() -> None:
    assert "the layerwise (decode-first) proxy works with SfaRemoteD2H" in error(
        MC, "proxy.flow=layerwise", "proxy.bind=192.168.10.1"
    )


def test_sparse_offload_needs_bf16_main_cache() -> None:
    msg = error(LW, "model.dtype=float16")
    assert "model.dtype: sparse KV offload requires a BF16 main SFA cache" in msg
    assert "--kv-cache-dtype fp8" in error(LW, "decode.args=[--kv-cache-dtype, fp8]")


def test_950_needs_device_urma_on_both_sides() -> None:
    msg = error(LW, "hosts.p1.hardware=950", "hosts.p1.devices=16")
    assert "950 hosts require device_urma on both sides" in msg
    assert "Set memfabric_protocol: device_urma on both groups" in msg


def test_mooncake_with_pp_and_cp_together() -> None:
    msg = error(MC, "prefill.pp=2", "prefill.cp=2", "prefill.tp=2", "prefill.instances=1")
    assert "prefill.cp: Mooncake does not support pipeline and context parallel together" in msg


def test_two_p2p_connectors_in_one_group() -> None:
    assert "both return kv_transfer_params" in error(
        MC, "prefill.kv_connectors=[mooncake, nixl]", "decode.kv_connectors=[mooncake, nixl]"
    )


def test_p2p_connector_on_a_mixed_group() -> None:
    assert "mixed.kv_connectors: mooncake moves KV from a prefill to a decode instance" in error(
        MIXED, "mixed.kv_connectors=[mooncake]", "kv.mooncake={host: n1}"
    )


def test_mixed_beside_prefill_and_decode_is_refused() -> None:
    msg = error(UCM, "mixed={hosts: [p1], kv_connectors: [ucm]}")
    assert "mixed: a mixed group cannot be combined with prefill/decode groups" in msg


def test_mixed_group_rules_name_the_mixed_group() -> None:
    msg = error(MIXED, "mixed.sparse_offload={topk_buffer_size: 128}")
    assert "a mixed engine with it is refused" in msg
    assert "from mixed" in msg
    assert "mixed.kv_role: a mixed group both prefills and decodes" in error(
        MIXED, "mixed.kv_role=kv_producer"
    )


def test_ucm_tp_must_match_between_prefill_and_decode() -> None:
    assert "decode.tp: UCM keys blocks by TP size" in error(UCM, "decode.tp=2", "decode.dp=2")


def test_layerwise_tp_mismatch_on_the_pool() -> None:
    msg = error(LW, "decode.kv_connectors=[sfa_d2h, ascend_store]", "decode.tp=8")
    assert (
        "decode.tp: prefill saves layerwise KV to the pool with tp 16 but decode reads it "
        "with tp 8; AscendStore refuses a TP mismatch with layerwise transfer"
    ) in msg


def test_model_runner_v2_from_env_counts() -> None:
    assert "sparse KV offload needs Model Runner V1" in error(
        LW, "decode.env={VLLM_USE_V2_MODEL_RUNNER: '1'}"
    )


def test_sfa_c8_through_additional_config_counts() -> None:
    assert "cannot be combined with sparse SFA C8" in error(
        LW, "decode.additional_config={enable_sparse_sfa_c8: true}"
    )


# --- values that look valid to the schema but are not ---


@pytest.mark.parametrize("seed", ["-1", "4294967296", "random", "0x10", "1.5"])
def test_pythonhashseed_range(seed: str) -> None:
    msg = error(MC, f"env.PYTHONHASHSEED='{seed}'")
    assert "env.PYTHONHASHSEED: " in msg
    assert "is not an integer in [0, 4294967295]" in msg


def test_pythonhashseed_as_yaml_number_is_accepted() -> None:
    p = plan(MC, "env.PYTHONHASHSEED=4294967295")
    assert ("PYTHONHASHSEED", "4294967295") in p.process("prefill-0").env


@pytest.mark.parametrize("value", ["true", "'2'", "2.0"])
def test_no_bool_or_text_as_int(value: str) -> None:
    msg = error(LW, f"decode.tp={value}")
    assert "decode.tp: tp must be a whole number" in msg


def test_empty_ucm_storage() -> None:
    assert "kv.ucm.storage: is empty" in error(UCM, "kv.ucm.storage=''")


def test_duplicate_hosts_in_a_group() -> None:
    assert "decode.hosts: 'd1' is listed twice; list each entry once." in error(
        LW, "decode.hosts=[d1, d1]"
    )


def test_idle_host_is_refused_unless_intended() -> None:
    more = ("hosts.d2={address: 192.168.20.3}", "decode.hosts=[d1, d2]")
    e = error(LW, *more)
    assert "decode.hosts: decode lists d2 but its 1 instance(s) of dp 1 x tp 16" in e
    assert "allow_idle_hosts: true" in e
    plan(LW, *more, "decode.allow_idle_hosts=true")


def test_debug_only_keep_device_kv_cache_warns() -> None:
    assert "keep_device_kv_cache is a debug-only option" in warnings(
        LW, "decode.sparse_offload.keep_device_kv_cache=true"
    )


def test_hashing_connector_without_seed_warns() -> None:
    p = load_plan(MC, sets=["env={}"], base_dir="/srv/kvpd")
    assert any("PYTHONHASHSEED is not set, but prefill uses mooncake" in w for w in p.warnings)


def test_ucm_config_cannot_repeat_managed_keys() -> None:
    assert "kv.ucm.config.storage_backends: storage_backends is written by kvpd" in error(
        UCM, "kv.ucm.config={storage_backends: /x}"
    )


def test_ucm_config_shard_bytes_must_be_a_number() -> None:
    assert "kv.ucm.config.data_dir_shard_bytes: 'x' is not a whole number in [0, 5]" in error(
        UCM, "kv.ucm.config={data_dir_shard_bytes: x}"
    )


def test_mooncake_device_name_empty_for_ascend() -> None:
    assert "device_name must be empty with the ascend protocol" in error(
        MC, "kv.mooncake.device_name=eth0"
    )


def test_mooncake_lease_must_outlive_transfer_timeout() -> None:
    assert "default_kv_lease_ttl 11000 ms is not above ASCEND_TRANSFER_TIMEOUT 20000 ms" in error(
        MC, "env={PYTHONHASHSEED: '0', ASCEND_TRANSFER_TIMEOUT: '20000'}"
    )


@pytest.mark.parametrize("address", ["127.0.0.1", "127.1.2.3", "localhost", "::1"])
def test_a_loopback_host_in_a_cluster_is_refused(address: str) -> None:
    msg = error(MC, f"hosts.d1.address={address}")
    assert (
        f"hosts.d1.address: host 'd1' has the loopback address {address}, but it runs decode "
        f"engines that host p1 must reach, and there {address} is the host itself. Set "
        "hosts.d1.address to its address on the network the hosts share." in msg
    ), msg


def test_loopback_is_right_when_everything_runs_here() -> None:
    plan("local")  # one host, 127.0.0.1
    plan(MC, "hosts.p1.address=127.0.0.1", "hosts.d1.address=127.0.0.2")  # all on this machine


def test_a_loopback_host_that_only_runs_the_proxy_passes() -> None:
    p = plan(
        MC,
        "hosts={p1: {address: 192.168.10.1, devices: 8}, d1: {address: 192.168.10.2, "
        "devices: 8}, here: {address: 127.0.0.1}}",
        "proxy.host=here",
    )
    assert p.process("proxy").host == "here"


def test_memcache_on_loopback_with_remote_clients() -> None:
    msg = error(
        LW,
        "hosts.p1.address=127.0.0.1",
        "kv.memcache.host=p1",
        "hosts.p1.transport=ssh",
        "prefill.hosts=[d1]",
        "decode.hosts=[p1]",
    )
    assert (
        "kv.memcache.host: the MetaService host 'p1' has the loopback address 127.0.0.1, "
        "but memcache clients on other hosts must reach it" in msg
    )


def test_sparse_offload_needs_a_latent_kv_model() -> None:
    assert "model.attention: sparse KV offload supports only SFA/MLA-style models" in error(
        LW,
        "model.attention=gqa",
        "prefill.layerwise=null",
        "prefill.kv_connectors=[sfa_d2h]",
        "kv.memcache=null",
    )


def test_host_protocols_get_this_hosts_hcom_url() -> None:
    p = plan(LW, "kv.memcache.protocol=host_rdma")
    text = next(f.content for f in p.files if f.path == "conf/mmc-local.conf")
    assert "ock.mmc.local_service.hcom_url = tcp://192.168.20.1:7000\n" in text


def test_mooncake_master_extra_args_cannot_move_its_ports() -> None:
    assert (
        "kv.mooncake.extra_args[0]: --port is set by kvpd (and checked in the port ledger); "
        "remove it and set kv.mooncake.port instead."
    ) in error(MC, "kv.mooncake.extra_args=[--port=1234]")


def test_tp_must_shard_the_kv_heads() -> None:
    assert "prefill.tp: tp 3 cannot shard the model's 8 KV heads" in error(
        UCM, "prefill.tp=3", "decode.tp=3"
    )


def test_address_that_looks_like_ipv4_must_be_one() -> None:
    assert "'999.1.1.1' is not a valid IPv4 address" in error(LW, "hosts.p1.address=999.1.1.1")


# --- free-text fields that reach a command line or a path get a type of their own ---


@pytest.mark.parametrize(
    ("set_", "says"),
    [
        (
            "model.served_name=''",
            "model.served_name: is empty; give a value or leave the field out",
        ),
        ("model.tokenizer='  '", "model.tokenizer: is empty; give a value or leave the field out"),
        ("engine.quantization=''", "engine.quantization: is empty; give a value"),
        ("engine.kv_cache_memory_bytes=lots", "'lots' is not a byte count vLLM reads"),
        ("engine.kv_cache_memory_bytes=1.5G", "'1.5G' is not a byte count vLLM reads"),
        ("bench.request_rate=0", "bench.request_rate: request_rate must be greater than 0.0"),
        ("bench.request_rate=-1", "bench.request_rate: request_rate must be greater than 0.0"),
        ("bench.num_prompts=1000001", "bench.num_prompts: num_prompts must be at most 1000000"),
        ("runtime.run_dir=''", "runtime.run_dir: is empty; give the run dir a folder of its own"),
        ("runtime.run_dir=/", "runtime.run_dir: '/' is the root, a top-level or a home folder"),
        ("runtime.run_dir=/etc", "'/etc' is the root, a top-level or a home folder"),
        ("runtime.run_dir=.", "'.' is the root, a top-level or a home folder"),
        ("runtime.run_dir=/home/bob", "'/home/bob' is the root, a top-level or a home folder"),
        ("hosts.p1.run_dir=/root", "hosts.p1.run_dir: '/root' is the root, a top-level or a home"),
    ],
)
def test_free_text_fields_are_typed(set_: str, says: str) -> None:
    assert says in error(MC, set_)


@pytest.mark.parametrize(
    "set_",
    [
        "engine.kv_cache_memory_bytes=16G",
        "engine.kv_cache_memory_bytes=2.5g",
        "engine.kv_cache_memory_bytes=2147483648",
        "runtime.run_dir=/opt/kvpd/mc",
        "runtime.run_dir=/home/bob/kvpd",
        "runtime.run_dir=work/kvpd",
        "bench.request_rate=2.5",
        "model.served_name=Qwen/QwQ-32B",
    ],
)
def test_good_values_of_those_fields_pass(set_: str) -> None:
    plan(MC, set_)


# --- each bench scenario is a profile too: `plan` builds it, `bench` would fail on it later ---


def test_a_scenario_whose_sets_break_the_profile_is_refused_by_plan() -> None:
    msg = error(
        MC,
        "bench.scenarios={typo: {sets: [engine.max_num_seqz=4]}, "
        "zero: {sets: [engine.max_num_seqs=0], without: [ucm]}}",
    )
    assert "bench.scenarios.typo: the profile with this scenario's changes " in msg
    assert "(engine.max_num_seqz=4) is refused: " in msg
    assert "max_num_seqz" in msg
    # the connectors its `without` detaches are part of what is built
    assert "bench.scenarios.zero: the profile with this scenario's changes " in msg
    assert "(engine.max_num_seqs=0, prefill.kv_connectors=[mooncake]) is refused" in msg
    assert "max_num_seqs must be at least 1, not 0" in msg


def test_a_scenario_that_breaks_a_rule_is_refused_by_plan() -> None:
    msg = error(LW, "bench.scenarios={big: {sets: [decode.tp=3]}}")
    assert "bench.scenarios.big: the profile with this scenario's changes (decode.tp=3)" in msg


def test_the_bundled_scenarios_all_plan() -> None:
    for name in (MC, UCM, MIXED, "large-ep"):
        plan(name)


def test_resolving_a_deployment_name_does_not_build_the_scenarios() -> None:
    # `kvpd down/status PROFILE` need only the plan's name: a broken scenario does not block them
    broken = "bench.scenarios={typo: {sets: [engine.max_num_seqz=4]}}"
    assert load_plan(MC, sets=[broken], scenarios=False).deployment == MC
