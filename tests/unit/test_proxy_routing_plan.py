"""The routing options of a profile's `proxy:` rendered as `kvpd proxy` flags, refused for
vLLM-Ascend's proxy, and the proxy each embedded profile plans routing by cache over all its
prefill instances (DP ranks run as separate processes included)."""

from __future__ import annotations

import asyncio

import pytest

from kvpd.proxy.app import ProxyApp
from kvpd.proxy.config import parse_args
from tests.unit.test_rules import error, plan

PROFILES = ("local", "large-ep", "layerwise-sparse-1p1d", "ucm-centralized-2p2d",
            "ucm-mooncake-2p2d", "ucm-pd-mixed")  # fmt: skip


def _proxy_argv(name: str, *sets: str) -> list[str]:
    """The proxy's flags, but the admin token's file (written by `up`)."""
    if name == "ucm-pd-mixed":  # the guide serves it without a proxy; kvpd can add one
        sets = ("proxy.host=n1", *sets)
    cmd = list(plan(name, *sets).process("proxy").command)
    argv = cmd[cmd.index("kvpd.proxy") + 1 :]
    i = argv.index("--admin-token-file")
    return argv[:i] + argv[i + 2 :]


def test_routing_renders_only_what_the_profile_sets() -> None:
    assert not {"--routing", "--prefix-capacity-tokens", "--decode-affinity"} & set(
        _proxy_argv("large-ep")
    )
    sets = ("proxy.routing=least-loaded", "proxy.prefix_capacity_tokens=65536")
    argv = _proxy_argv("large-ep", *sets, "proxy.decode_affinity=true")
    i = argv.index("--routing")
    assert argv[i : i + 5] == ["--routing", "least-loaded", "--prefix-capacity-tokens", "65536",
                               "--decode-affinity"]  # fmt: skip
    cfg = parse_args(argv)
    assert (cfg.routing, cfg.prefix_capacity_tokens, cfg.decode_affinity) == (
        "least-loaded", 65536, True
    )  # fmt: skip


def test_routing_is_refused_for_vllm_ascends_proxy() -> None:
    msg = error("large-ep", "proxy.impl=vllm-ascend", "proxy.routing=cache-aware")
    assert "proxy.routing: vLLM-Ascend's example proxy balances by load only" in msg
    assert "proxy.routing" in error("large-ep", "proxy.routing=random")
    assert "proxy.prefix_capacity_tokens" in error("large-ep", "proxy.prefix_capacity_tokens=0")


@pytest.mark.parametrize("name", PROFILES)
def test_every_profiles_proxy_routes_its_prefill_instances_by_cache(name: str) -> None:
    cfg = parse_args(_proxy_argv(name))
    loop = asyncio.new_event_loop()
    try:
        app = ProxyApp(cfg, loop)
        pool = app.decoders if cfg.flow == "mixed" else app.prefillers
        assert len(pool.backends) == len(cfg.decoders if cfg.flow == "mixed" else cfg.prefillers)
        if len(pool.backends) == 1:  # nothing to choose: no index, no keys computed
            assert pool.policy is None
        else:
            assert pool.policy is not None
            assert len(pool.backends) == len(pool.policy.indexes)
        assert app.decoders.policy is None or cfg.flow == "mixed"
    finally:
        loop.close()


def test_large_ep_routes_over_each_prefill_dp_rank() -> None:
    argv = _proxy_argv("large-ep")
    hosts = argv[argv.index("--prefiller-hosts") + 1 : argv.index("--prefiller-ports")]
    assert len(hosts) > 1  # one backend per DP rank's process: the guide's large-EP case


def _capacity(name: str, *sets: str) -> int | None:
    argv = _proxy_argv(name, *sets)
    flag = "--prefix-capacity-tokens"
    return int(argv[argv.index(flag) + 1]) if flag in argv else None


def test_the_index_capacity_comes_from_the_kv_cache_the_profile_sizes() -> None:
    # local: 16 MiB of KV cache per engine; 2 layers x 2 KV heads x 32 x K,V x 2 bytes = 512 B
    assert _capacity("local") == 16 * 2**20 // 512
    assert _capacity("local", "prefill.instances=2", "hosts.localhost.devices=3") == 32768
    assert _capacity("local", "proxy.prefix_capacity_tokens=1000") == 1000  # the profile's
    assert _capacity("large-ep") is None  # sized by vLLM at start: the proxy's default
    # a latent KV (MLA) is not split by TP; every DP rank's process is its own backend
    per_token = plan("large-ep").sizing.kv_bytes_per_token
    assert per_token
    assert _capacity("large-ep", "engine.kv_cache_memory_bytes=2G") == 2 * 2**30 // per_token
