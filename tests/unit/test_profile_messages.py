"""Message class: each problem is one message that names the field that caused it,
prints effective values, names the group it is about, and says how to fix it."""

from __future__ import annotations

import re

import pytest

from kvpd.errors import ProfileError
from kvpd.plan.build import load_plan
from kvpd.profile.load import parse_profile

LW = "layerwise-sparse-1p1d"
MC = "ucm-mooncake-2p2d"
UCM = "ucm-centralized-2p2d"
MIXED = "ucm-pd-mixed"
EP = "large-ep"

# Broken profiles covering every rule module; their messages are audited below.
BROKEN = [
    (LW, "prefill.tp=8"),
    (LW, "prefill.tp=12", "decode.tp=8"),
    (LW, "prefill.hosts=[p2]"),
    (EP, "decode.dp_size_local=4"),
    (EP, "decode.dp=7"),
    (EP, "prefill.dp=6"),
    (EP, "decode.dp_size_local=3"),
    (EP, "decode.dp_launch=single"),
    (LW, "decode=null", "proxy=null"),
    (LW, "decode.kv_port=65530"),
    (LW, "decode.port=20055"),
    (LW, "kv.memcache=null"),
    (LW, "prefill.enforce_eager=false"),
    (LW, "prefill.layerwise.independent_layers=[200]"),
    (LW, "prefill.kv_connectors=[sfa_d2h]"),
    (LW, "prefill.sparse_offload={topk_buffer_size: 4096}"),
    (LW, "decode.kv_role=kv_both"),
    (LW, "decode.cp=2"),
    (LW, "decode.pp=2"),
    (LW, "model.index_topk=null"),
    (LW, "decode.sparse_offload=null"),
    (LW, "kv.memcache.dram_size=ten"),
    (LW, "decode.sparse_offload.topk_buffer_size=1000"),
    (LW, "model.compressed=true"),
    (LW, "decode.model_runner_v2=true"),
    (LW, "decode.sfa_c8=true"),
    (LW, "decode.sparse_offload.topk_buffer_size=0"),
    (LW, "kv.memcache.world_size=1"),
    (LW, "kv.memcache.protocol=host_shm"),
    (LW, "kv.memcache.metrics_port=5000"),
    (LW, "model.attention=gqa"),
    (LW, "prefill.layerwise.backend=mooncake"),
    (LW, "hosts.d1.hardware=a2"),
    (LW, "decode.memfabric_protocol=device_urma"),
    (LW, "decode.kv_role=kv_producer"),
    (LW, "prefill.kv_role=kv_consumer"),
    (LW, "decode.sparse_offload.dram_size_per_dp_gb=1", "decode.max_num_seqs=64"),
    (LW, "hosts.d1.memory_gb=10"),
    (MC, "kv.mooncake=null"),
    (MC, "kv.mooncake.protocol=tcp"),
    (MC, "kv.mooncake.global_segment_size=1G"),
    (MC, "decode.pp=2"),
    (MC, "prefill.kv_connectors=[]"),
    (MC, "proxy=null"),
    (MC, "decode.block_size=64"),
    (UCM, "kv.ucm.shared=false"),
    (UCM, "kv.ucm.config={hit_ratio: 0.5}"),
    (UCM, "kv.ucm.connector=UcmNfsStore"),
    (UCM, "kv.ucm=null"),
    (UCM, "prefill.pp=2"),
    (UCM, "hosts.d1.address=192.168.10.1"),
    (UCM, "decode.hosts=[nowhere]"),
    (LW, "proxy.bind=0.0.0.0"),
    (MIXED, "proxy={host: n1, impl: vllm-ascend}"),
    ("local", "prefill.kv_connectors=[mooncake]", "decode.kv_connectors=[mooncake]"),
    (
        "local",
        "prefill.kv_connectors=[example]",
        "decode.kv_connectors=[example]",
        "kv.example_path=null",
    ),
    (
        "local",
        "prefill.kv_connectors=[kvpd_store]",
        "decode.kv_connectors=[kvpd_store]",
        "kv.kvpd_store=null",
    ),
    ("local", "prefill.kv_connectors=[nixl, nixl]", "decode.kv_connectors=[nixl]"),
]
FIX = re.compile(
    r"\b(use|set|add|remove|move|lower|raise|pick|give|write|leave|drop|change|turn|point|"
    r"prefer|list|check|rename|pass|serve|split|keep|mount|quote|fix|increase|round)\b",
    re.IGNORECASE,
)


def messages(name: str, *sets: str) -> list[str]:
    with pytest.raises(ProfileError) as e:
        load_plan(name, sets=list(sets), base_dir="/srv/kvpd")
    return e.value.problems


@pytest.mark.parametrize("case", BROKEN, ids=lambda c: " ".join(c[1:]))
def test_every_error_says_how_to_fix_it_and_never_prints_none(case: tuple[str, ...]) -> None:
    for msg in messages(*case):
        text = msg.split(": ", 2)[-1]
        assert FIX.search(text), f"no fix in: {msg}"
        assert "None" not in text, msg


def test_port_error_names_the_field_that_caused_the_port() -> None:
    (msg,) = messages(LW, "decode.kv_port=8200")
    assert msg.startswith("bundled:layerwise-sparse-1p1d:50: decode.kv_port: port 8200 on host ")
    assert "decode-0 (http) and decode-0 (sfa_d2h kv_port dp0 tp0)" in msg
    assert "Move decode.kv_port or decode.port" in msg


def test_ten_overflowing_ports_are_one_message() -> None:
    (msg,) = messages(LW, "decode.kv_port=65530")
    assert ": decode.kv_port: 10 ports in 65536-65545 of decode-0 lie above 65535" in msg


def test_a_clashing_range_is_one_message() -> None:
    problems = messages(MC, "prefill.kv_port=9000", "prefill.port=9000")
    clashes = [m for m in problems if "used twice" in m and "prefill.port" in m]
    assert len(clashes) == 1, problems
    assert "prefill.kv_port" in clashes[0]
    assert "prefill.port" in clashes[0]


def test_effective_block_size_is_printed() -> None:
    (msg,) = messages(MC, "decode.block_size=64")
    assert "prefill block_size 128 differs from decode 64" in msg


def test_schema_messages_are_sentences_about_the_field() -> None:
    text = (
        "name: x\nhosts:\n  h: {address: 1.2.3.4}\nmodel: {path: /m}\n"
        "bench: {sweep: {input_len: [0]}}\nmixed: {hosts: [h], tp: 0}\n"
    )
    with pytest.raises(ProfileError) as e:
        parse_profile(text, "p.yaml")
    msg = str(e.value)
    assert "p.yaml:6: mixed.tp: tp must be at least 1, not 0. Set it to at least 1." in msg
    assert "p.yaml:5: bench.sweep.input_len[0]: this entry must be at least 1, not 0." in msg
    assert "input should be" not in msg


def test_union_errors_are_one_message() -> None:
    text = (
        "name: x\nhosts:\n  h: {address: 1.2.3.4}\nmodel: {path: /m}\nbench: {request_rate: fast}\n"
    )
    with pytest.raises(ProfileError) as e:
        parse_profile(text, "p.yaml")
    assert e.value.problems == [
        "p.yaml:5: bench.request_rate: request_rate must be a number or one of 'inf', not "
        "'fast'. Set it to a number."
    ]


def test_quoted_number_gets_told_to_drop_the_quotes() -> None:
    text = (
        "name: x\nhosts:\n  h: {address: 1.2.3.4}\nmodel: {path: /m}\nmixed: {hosts: [h],"
        " port: '80'}\n"
    )
    with pytest.raises(ProfileError) as e:
        parse_profile(text, "p.yaml")
    assert (
        "port must be a whole number, not '80'. Set it to a whole number (without "
        "quotes)." in str(e.value)
    )


def test_a_rule_about_the_mixed_group_names_it() -> None:
    (msg,) = messages(MIXED, "mixed.sparse_offload={topk_buffer_size: 128}")
    assert "mixed.sparse_offload" in msg
    assert "prefill" not in msg


WARNED = [
    (LW, "prefill.layerwise.independent_layers=all"),
    (LW, "prefill.layerwise.num_shared_buffers=null"),
    (LW, "prefill.layerwise.num_shared_buffers=100"),
    (LW, "decode.sparse_offload.keep_device_kv_cache=true"),
    (LW, "kv.memcache.dram_size=1GB"),
    (LW, "kv.memcache.dram_size=1500MB"),
    (MC, "kv.mooncake.global_segment_size=1536MB"),
    (MC, "env={}"),
    (UCM, "kv.ucm.shared=null"),
    ("local", "bench.input_len=600"),
    (LW, "proxy.impl=vllm-ascend"),
]


@pytest.mark.parametrize("case", WARNED, ids=lambda c: " ".join(c[1:]))
def test_every_warning_says_what_to_do(case: tuple[str, ...]) -> None:
    plan = load_plan(case[0], sets=list(case[1:]), base_dir="/srv/kvpd")
    assert plan.warnings
    for msg in plan.warnings:
        text = msg.split(": ", 2)[-1]
        assert FIX.search(text), f"no fix in: {msg}"
        assert "None" not in text, msg
