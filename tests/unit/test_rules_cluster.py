"""What a real cluster would still hit: per class of rule, a bundled profile changed to break
it and the located message the user gets (file, line, field, what is wrong, how to fix)."""

from __future__ import annotations

import pytest

from tests.unit.test_rules import LW, error, plan, warnings

MC = "ucm-mooncake-2p2d"
UCM = "ucm-centralized-2p2d"
MIXED = "ucm-pd-mixed"


# --- pass-through flags that change what kvpd derives -------------------------------------


def test_mooncake_rpc_port_in_extra_args_is_refused() -> None:
    msg = error(MC, "kv.mooncake.extra_args=['--rpc_port=50099']")
    assert "bundled:ucm-mooncake-2p2d:27: kv.mooncake.extra_args[0]: --rpc_port changes" in msg
    assert "set kv.mooncake.port" in msg


@pytest.mark.parametrize("flag", ["--rpc_address=10.0.0.9", "--metrics_host", "--flagfile=/x"])
def test_mooncake_flags_that_move_derived_addresses_are_refused(flag: str) -> None:
    msg = error(MC, f"kv.mooncake.extra_args=['{flag}', '10.0.0.9']")
    assert "kv.mooncake.extra_args[0]: --" in msg
    assert "changes what kvpd derives" in msg


def test_unknown_mooncake_master_flag_is_refused_with_a_suggestion() -> None:
    msg = error(MC, "kv.mooncake.extra_args=['--client_tll=120']")
    assert "kv.mooncake.extra_args[0]: --client_tll is not a mooncake_master flag" in msg
    assert "Did you mean --client_ttl?" in msg


def test_known_mooncake_flags_values_and_negated_bools_pass() -> None:
    args = "['--client_ttl', '120', '--enable_offload=false', '--noenable_ha', '-max_threads=4']"
    plan(MC, f"kv.mooncake.extra_args={args}")


# --- host memory --------------------------------------------------------------------------


def test_memcache_dram_times_local_ranks_above_memory_gb() -> None:
    msg = error(LW, "kv.memcache.dram_size=200GB", "hosts.p1.memory_gb=1000")
    assert "kv.memcache.dram_size: 200GB per rank x 16 LocalService ranks on 'p1' = 3200 GB" in msg
    assert "above its memory_gb 1000. Lower dram_size to 62GB or less" in msg


def test_ucm_shm_above_memory_gb() -> None:
    msg = error(MIXED, "hosts.n1.memory_gb=100", "kv.ucm.config={share_buffer_enable: true}")
    assert "bundled:ucm-pd-mixed:20: kv.ucm.cache_buffer_capacity_gb: UCM's share buffers" in msg
    assert "need 128 GB of /dev/shm" in msg
    assert "above its memory_gb 100" in msg


# --- vLLM start-time refusals -------------------------------------------------------------


def test_batched_tokens_below_max_model_len_without_chunked_prefill() -> None:
    msg = error(UCM, "engine.max_num_batched_tokens=4000", "engine.enable_chunked_prefill=false")
    assert "ucm-centralized-2p2d:32: engine.max_num_batched_tokens: prefill, decode: " in msg
    assert "below max_model_len 17000 with chunked prefill off" in msg
    assert "Raise max_num_batched_tokens to 17000" in msg
    assert msg.count("max_model_len 17000 with chunked") == 1  # one message for the engine value
    plan(UCM, "engine.max_num_batched_tokens=4000")  # chunked prefill on (vLLM's default)


def test_batched_tokens_below_max_num_seqs() -> None:
    msg = error(UCM, "decode.max_num_batched_tokens=16")
    assert "decode.max_num_batched_tokens: decode: max_num_batched_tokens 16 is below " in msg
    assert "max_num_seqs 20; vLLM refuses to start" in msg


# --- plugins ------------------------------------------------------------------------------


def test_vllm_plugins_without_the_ascend_platform_plugin() -> None:
    msg = error(LW, "decode.env={VLLM_PLUGINS: kvpd_sparse_planner}")
    assert "decode.env.VLLM_PLUGINS: VLLM_PLUGINS='kvpd_sparse_planner'" in msg
    assert "leaves out vLLM-Ascend's platform plugin 'ascend'" in msg
    assert "Set VLLM_PLUGINS=ascend,kvpd_sparse_planner" in msg
    plan(LW, "decode.env={VLLM_PLUGINS: 'ascend,kvpd_sparse_planner'}")


# --- proxy placement and flow -------------------------------------------------------------


def test_layerwise_proxy_on_a_loopback_host_with_remote_decode() -> None:
    msg = error(LW, "hosts.px={address: 127.0.0.1}", "proxy.host=px")
    assert "hosts.px.address: the layerwise proxy runs on 'px' at 127.0.0.1" in msg
    assert "decode on d1 calls <proxy>/v1/metaserver" in msg


def test_sfa_with_vllm_ascends_prefill_first_script() -> None:
    script = "examples/disaggregated_prefill_v1/load_balance_proxy_server_example.py"
    msg = error(LW, "proxy.impl=vllm-ascend", f"proxy.script={script}")
    assert f"proxy.script: {script} is vLLM-Ascend's prefill-first proxy" in msg
    assert "load_balance_proxy_layerwise_server_example.py" in msg


# --- service settings the services refuse -------------------------------------------------


def test_evict_threshold_high_below_the_default_low() -> None:
    msg = error(LW, 'kv.memcache.meta_extra={"ock.mmc.evict_threshold_high": "50"}')
    assert "meta_extra.ock.mmc.evict_threshold_high: evict thresholds low 80 (the default)" in msg


def test_unknown_ucm_store_pipeline() -> None:
    msg = error(UCM, "kv.ucm.pipeline=Cache|Nfs")
    assert "bundled:ucm-centralized-2p2d:22: kv.ucm.pipeline: 'Cache|Nfs' is not a UCM" in msg
    assert "Cache|Posix" in msg


def test_container_name_docker_refuses() -> None:
    msg = error(UCM, "runtime.run_dir=/data/run", "hosts.p1.container={name: a, runtime: docker}")
    assert "hosts.p1.container.name:" in msg
    assert "(2 to 128 characters)" in msg


# --- scenarios that remove the only P->D path ---------------------------------------------


@pytest.mark.parametrize(
    ("profile", "without", "group"), [(UCM, "ucm", "prefill"), (MC, "mooncake", "decode")]
)
def test_scenario_removing_the_only_pd_path_is_refused(
    profile: str, without: str, group: str
) -> None:
    msg = error(profile, f"bench.scenarios={{x: {{without: [{without}]}}}}")
    assert f"bench.scenarios.x.without: detaching {without} leaves {group} without" in msg
    assert "the only P->D path" in msg


# --- files --------------------------------------------------------------------------------


def test_log_name_of_another_process_on_the_host() -> None:
    msg = error(LW, "prefill.log_name=proxy.log")
    assert "prefill.log_name: proxy and prefill-0 on p1 would both write logs/proxy.log" in msg
    assert "that is proxy's log; choose another log_name" in msg


def test_empty_kvpd_store_path() -> None:
    msg = error("local", "kv.kvpd_store.path=''")
    assert "kv.kvpd_store.path: is empty, which would put the store into the profile" in msg


# --- one hash seed for instances sharing a store ------------------------------------------


def test_ucm_engines_without_a_hash_seed_get_one_pinned_seed() -> None:
    p = plan(UCM, "env={}")
    seeds = {dict(e.env).get("PYTHONHASHSEED") for e in p.processes if e.role != "proxy"}
    assert seeds == {"0"}
    assert "kvpd sets PYTHONHASHSEED=0 for all of them" in "\n".join(p.warnings)
    mine = plan(UCM)  # the profile's own seed wins, and nothing is said
    assert {dict(e.env).get("PYTHONHASHSEED") for e in mine.processes if e.role != "proxy"} == {
        "123456"
    }
    assert "PYTHONHASHSEED" not in "\n".join(mine.warnings)


# --- warnings -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("profile", "sets", "expect"),
    [
        (UCM, ["kv.ucm.storage=/dev/shm/ucm"],
         "kv.ucm.storage: /dev/shm/ucm is a per-host memory filesystem"),
        ("local", ["hosts.localhost={address: 10.0.0.1, devices: 2}", "kv.kvpd_store.path=/kv",
                   "hosts.h2={address: 10.0.0.2, devices: 2}", "decode.hosts=[h2]"],
         "kv.kvpd_store.path: /kv is used by h2, localhost, which must then see one folder"),
        (UCM, ["decode.max_model_len=16000"],
         "decode.max_model_len: decode max_model_len 16000 is below prefill's 17000"),
        (UCM, ["bench.input_len=100", "bench.protocol=prefix"],
         "bench.input_len: the prefix protocol seeds 80 tokens (100 x 0.8), less than one KV "
         "block of 128"),
        (UCM, ["runtime.run_dir=/data/run", "kv.ucm.config={share_buffer_enable: true}",
               "hosts.p1.container={image: 'quay.io/ascend/vllm-ascend:v1', shm_gb: 8}"],
         "hosts.p1.container.shm_gb: shm_gb 8 is below the 128 GiB"),
        (LW, ["proxy.first_byte_timeout_s=10", "proxy.prefill_timeout_s=100"],
         "proxy.first_byte_timeout_s: first_byte_timeout_s 10 is below prefill_timeout_s 100"),
    ],
)  # fmt: skip
def test_warnings(profile: str, sets: list[str], expect: str) -> None:
    assert expect in warnings(profile, *sets)


# --- messages -----------------------------------------------------------------------------


def test_a_host_name_in_ip_is_reported_at_ip() -> None:
    msg = error(UCM, "hosts.p1.nic=eth0", "hosts.p1.ip=p1.example")
    assert "hosts.p1.ip: HCCL_IF_IP, VLLM_HOST_IP of prefill on 'p1' needs a numeric IP" in msg
    assert "the ip is the name 'p1.example'" in msg


def test_an_idle_host_two_groups_list_is_one_message_per_group_field() -> None:
    # A listed host the layout leaves idle is refused (kvpd.plan.rules.placement): once for
    # each group that lists it, each at its own field, never twice for one field.
    msg = error(UCM, "hosts.p2={address: 192.168.10.3, devices: 8}", "prefill.hosts=[p1, p2]",
                "decode.hosts=[d1, p2]")  # fmt: skip
    assert msg.count("prefill.hosts: prefill lists p2") == 1
    assert msg.count("decode.hosts: decode lists p2") == 1


def test_every_set_reaches_the_plan_digest() -> None:
    assert plan(UCM).profile_digest != plan(UCM, "bench.num_prompts=20").profile_digest


def test_instances_spanning_hosts_need_the_nic_kvpd_never_assumes() -> None:
    msg = error("large-ep", "hosts.p2.nic=null")
    assert "bundled:large-ep:11: hosts.p2.nic: prefill instances span p1, p2, p3, p4" in msg
    assert "Set hosts.p2.nic to the interface of 192.168.10.2" in msg
    # named in the group's own environment instead: fine
    plan("large-ep", "hosts.p2.nic=null",
         "prefill.env={GLOO_SOCKET_IFNAME: ens3, HCCL_SOCKET_IFNAME: ens3}")  # fmt: skip
