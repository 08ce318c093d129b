"""Cache-aware routing: the prompt-prefix keys, the bounded index per backend, the policy with
its balance guard, which backends it may use, its options and its metrics."""

from __future__ import annotations

import asyncio

import pytest

from kvpd.proxy.backends import OPEN, Backend, BackendPool
from kvpd.proxy.cache_aware import CacheAware
from kvpd.proxy.config import ProxyConfig, ProxyConfigError, parse_args
from kvpd.proxy.hostpool import HostPool
from kvpd.proxy.prefix_index import GROW, PrefixIndex, chunk_tokens, prefix_keys
from tests.unit.proxy_cluster import Cluster, run_cluster

pytestmark = pytest.mark.timeout(60)

BLOCK = 4  # tokens of the first chunks here: 16 characters of text


# --- keys --------------------------------------------------------------------------------------
def keys(body: dict[str, object]) -> list[int]:
    return list(prefix_keys(body, BLOCK))


def test_keys_chain_whole_chunks_of_the_text() -> None:
    # chunks of 4, 4, 8, 8, 16, 16, 32, 32, 32 ... tokens: 16, 16, 32, 32, 64 ... characters
    assert [chunk_tokens(i, BLOCK) for i in range(10)] == [4, 4, 8, 8, 16, 16, 32, 32, 32, 32]
    shared = "a" * 64  # three chunks: 16 + 16 + 32
    one = keys({"prompt": shared + "b" * 32 + "tail"})
    two = keys({"prompt": shared + "c" * 32})
    assert len(one) == 4  # the partial last chunk ("tail") is not a key
    assert one[:3] == two[:3]
    assert one[3] != two[3]
    # a key stands for the whole prefix: the same chunk after a different start differs
    assert keys({"prompt": "x" * 16 + shared})[1:3] != one[1:3]
    assert keys({"prompt": "short"}) == []
    long = "".join(chr(65 + i % 50) for i in range(2000))  # 6 chunks in 224 chars, then 128 each
    assert len(prefix_keys({"prompt": long}, BLOCK)) == 6 + (2000 - 224) // 128


def test_keys_are_hashed_only_as_far_as_they_are_read() -> None:
    text = "".join(chr(65 + i % 50) for i in range(4000))
    lazy = prefix_keys({"prompt": text}, BLOCK)
    assert len(lazy) == 6 + (4000 - 224) // 128
    assert lazy._keys == []
    assert lazy[2] == keys({"prompt": text})[2]
    assert len(lazy._keys) == 3
    assert lazy.first(5) == keys({"prompt": text})[:5]
    assert list(lazy) == keys({"prompt": text})
    assert lazy[-1] == list(lazy)[-1]
    with pytest.raises(IndexError):
        lazy[len(lazy)]


def test_keys_of_token_ids_chat_and_batches() -> None:
    ids = keys({"prompt": list(range(10))})  # chunks of 4 and 4 ids
    assert len(ids) == 2
    assert ids == keys({"prompt": list(range(8)) + [99]})
    first = keys({"prompt": ["p" * 40, "q" * 40]})
    assert first == keys({"prompt": "p" * 40})
    system = {"role": "system", "content": "s" * 90}
    turn1 = keys({"messages": [system, {"role": "user", "content": "u" * 99}]})
    turn2 = keys({"messages": [system, {"role": "user", "content": "v" * 99}]})
    assert turn1[:3] == turn2[:3]
    assert turn1[4:] != turn2[4:]
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "s" * 64}]}]}
    assert keys(parts) == keys({"messages": [{"role": "user", "content": "s" * 64}]})
    for odd in ({"prompt": 5}, {"messages": "hi"}, {"prompt": [1, "x"]}, {}):
        assert keys(odd) == []


def test_keys_of_anthropic_messages_and_responses_inputs() -> None:
    system = "You are a careful assistant. " * 4
    one = {"system": system, "messages": [{"role": "user", "content": "a" * 80}]}
    two = {"system": [{"type": "text", "text": system}], "messages": [{"role": "user",
           "content": [{"type": "text", "text": "b" * 80}]}]}  # fmt: skip
    k1, k2 = keys(one), keys(two)
    assert k1[:4] == k2[:4]
    assert k1[4:] != k2[4:]
    other = keys({"system": "x" * 116, "messages": one["messages"]})
    assert other[0] != k1[0]
    said = {"input": "c" * 64}
    items = {"input": [{"role": "user", "content": [{"type": "input_text", "text": "c" * 64}]}]}
    assert len(keys(said)) == 3
    assert len(keys(items)) == 3
    assert keys({"input": 7}) == []


def test_a_1000_token_prompt_has_8_chunks_by_default() -> None:
    block = ProxyConfig().prefix_block
    assert len(prefix_keys({"prompt": "x" * 4000}, block)) == 8
    assert len(prefix_keys({"prompt": "x" * 600}, block)) == 3  # short ones: fine chunks


# --- the index ---------------------------------------------------------------------------------
def test_index_matches_leading_chunks_only() -> None:
    index = PrefixIndex(100, 1)
    index.insert((1, 2, 3))
    index.insert((1, 2, 3))  # held to 2 chunks: GROW more
    assert index.match((1, 2, 3, 4)) == 3
    assert index.match((1, 9, 3)) == 1
    assert index.match((9, 1, 2)) == 0
    assert index.match(()) == 0


def test_a_prompt_is_indexed_grow_chunks_deeper_each_time() -> None:
    index = PrefixIndex(1000, 1)  # chunks of 1, 1, 2, 2, 4, 4, 8 tokens
    prompt = tuple(range(10, 17))  # 22 tokens in 7 chunks
    index.insert(prompt)
    assert index.match(prompt) == GROW == 2
    assert index.tokens == 22  # the deepest chunk stands for the rest of the prompt
    index.insert(prompt)
    assert index.match(prompt) == 4
    assert index.tokens == 22
    index.insert(prompt[:3])  # a shorter one, fully held: nothing new
    assert index.tokens == 22
    assert index.uses(10) == 3
    assert index.uses(12) == 2
    assert index.uses(13) == 1
    lazy = prefix_keys({"prompt": "z" * 4000}, BLOCK)
    index.insert(lazy)  # a new prompt of 34 chunks costs GROW hashes
    assert len(lazy._keys) == GROW


def test_index_is_bounded_in_tokens_and_evicts_the_least_recently_used() -> None:
    index = PrefixIndex(4, 1)  # chunks of 1, 1, 2, 2, 4 ... tokens
    index.insert((1, 2))
    index.insert((3, 4))
    index.insert((1, 2))  # used again: now the newest
    index.insert((5, 6))  # evicts 3 and 4, the oldest
    assert (len(index), index.tokens) == (4, 4)
    assert index.match((1, 2)) == 2
    assert index.match((3, 4)) == 0
    assert index.match((5, 6)) == 2
    assert index.uses(1) == 2
    assert index.uses(5) == 1
    assert index.uses(3) == 0
    index.insert((7, 8, 9))  # 1 + 1 + 2 tokens (8 stands for 9 too): all that fits
    assert index.tokens == 4
    assert index.match((7, 8, 9)) == 2
    assert index.match((5,)) == 0
    index.insert(tuple(range(10, 15)))  # 1+1+2+2+4 tokens, more than the capacity
    assert index.tokens <= 4
    assert index.match((7,)) == 0
    index.clear()
    assert (len(index), index.tokens) == (0, 0)
    with pytest.raises(ValueError, match="capacity"):
        PrefixIndex(0, 1)


def test_continuations_are_evicted_before_their_prefix() -> None:
    index = PrefixIndex(6, 1)  # chunks of 1, 1, 2, 2 tokens
    index.insert((1, 2))
    index.insert((1, 2, 3))  # 4 tokens
    index.insert((1, 2, 4))  # shares 1 and 2: 2 more tokens, the index is full
    index.insert((9,))  # one more: the oldest continuation goes (3), never its prefix
    assert index.match((1, 2, 3)) == 2
    assert index.match((1, 2, 4)) == 3
    assert index.match((9,)) == 1
    assert (index.tokens, len(index)) == (5, 4)


def test_a_key_already_held_out_of_order_is_counted_once() -> None:
    index = PrefixIndex(100, 1)
    index.insert((1, 2))
    index.insert((5, 2))  # 2 is held (a collision, as far as the index can tell): not twice
    assert index.tokens == 1 + 1 + 1
    assert len(index) == 3


# --- the policy --------------------------------------------------------------------------------
def _pool(n: int, abs_: int = 100, rel: float = 1.5) -> tuple[BackendPool, CacheAware]:
    loop = asyncio.new_event_loop()
    try:
        backends = [Backend(HostPool("h", 8000 + i, loop, 1.0, f"prefill-{i}")) for i in range(n)]
        pool = BackendPool("prefill", backends, loop)
    finally:
        loop.close()
    pool.policy = CacheAware(pool.backends, 1000, 1, abs_, rel)
    return pool, pool.policy


def test_longest_match_wins_and_is_remembered() -> None:
    pool, cache = _pool(3)
    a, b, c = pool.backends
    first = pool.pick((), (1, 2, 3))
    assert first is not None
    # the same prompt, and one that extends it, go where it went (though it is not the
    # next in the round-robin of equal loads)
    assert pool.pick((), (1, 2, 3)) is first
    assert pool.pick((), (1, 2, 3, 4)) is first
    other = pool.pick((), (7, 8))  # no match anywhere: the least loaded
    for _ in range(3):  # indexed 2, then 4, then all 5 chunks deep
        cache.indexes[c.name].insert((1, 2, 3, 4, 5))
    assert pool.pick((), (1, 2, 3, 4, 5, 6)) is c  # longer match beats the earlier holder
    assert cache.decisions == {"prefix_match": 3, "no_match": 2, "balance_override": 0}
    assert other is not None
    assert cache.indexes[other.name].match((7, 8)) == 2
    assert pool.pick() in (a, b, c)  # no keys: by load, the index untouched


def test_equal_matches_split_by_load() -> None:
    pool, cache = _pool(2)
    a, b = pool.backends
    for backend in (a, b):
        cache.indexes[backend.name].insert((1, 2))
    a.begin(50)
    assert pool.pick((), (1, 2, 5)) is b
    a.end(50)
    b.begin(50)
    assert pool.pick((), (1, 2, 6)) is a


def test_balance_guard_needs_both_bounds() -> None:
    pool, cache = _pool(2, abs_=100, rel=1.5)
    a, b = pool.backends
    cache.indexes[a.name].insert((1, 2))
    b.begin(1000)
    a.begin(1090)  # 90 more: under the absolute bound
    assert pool.pick((), (1, 2)) is a
    a.begin(60)  # 150 more, but only 1.15 times as many: under the relative bound
    assert pool.pick((), (1, 2)) is a
    b.end(1000)
    b.begin(10)  # 1140 more and 115 times: by load
    assert pool.pick((), (1, 2)) is b
    assert cache.decisions["balance_override"] == 1
    # the overflow backend now holds the prefix too: the next ones tie and split by load
    assert cache.indexes[b.name].match((1, 2)) == 2


def test_the_bound_shrinks_as_more_requests_share_the_prefix() -> None:
    pool, cache = _pool(2, abs_=100, rel=1.5)
    a, b = pool.backends
    cache.indexes[a.name].insert((1, 2))  # one earlier request had this prefix
    b.begin(10)
    a.begin(90)
    assert pool.pick((), (1, 2, 3)) is a  # 80 more: within the bound of 100 / 1
    assert cache.indexes[a.name].uses(2) == 2
    assert pool.pick((), (1, 2, 4)) is b  # 80 more, now over 100 / 2: by load
    assert cache.decisions["balance_override"] == 1


@pytest.mark.parametrize("gate", ["drained", "open", "unhealthy"])
def test_a_backend_that_may_not_serve_is_not_matched(gate: str) -> None:
    pool, cache = _pool(2)
    a, b = pool.backends
    cache.indexes[a.name].insert((1, 2, 3))
    if gate == "drained":
        pool.set_draining(a, True)
    elif gate == "open":
        a.circuit = OPEN
    else:
        pool.mark_down(a, "refused")
    assert pool.pick((), (1, 2, 3)) is b
    assert pool.pick((b,), (1, 2, 3)) is None  # nothing else is usable


def test_an_index_is_emptied_when_its_backend_was_down() -> None:
    pool, cache = _pool(2)
    a, b = pool.backends
    cache.indexes[a.name].insert((1, 2, 3))
    pool.mark_down(a, "refused")
    pool.mark_up(a)  # back, but a restarted engine has an empty cache
    b.begin(10)
    assert pool.pick((), (1, 2, 3)) is a  # by load (no match), not by the stale index
    assert cache.decisions["no_match"] == 1


def test_excluded_backends_are_not_matched() -> None:
    pool, cache = _pool(2)
    a, b = pool.backends
    cache.indexes[a.name].insert((1, 2))
    assert pool.pick((a,), (1, 2)) is b  # a retry goes elsewhere


# --- options -----------------------------------------------------------------------------------
def test_routing_options() -> None:
    assert ProxyConfig().routing == "cache-aware"
    assert not ProxyConfig().decode_affinity
    cfg = parse_args(["--routing", "least-loaded", "--balance-rel", "2", "--decode-affinity"])
    assert (cfg.routing, cfg.balance_rel, cfg.decode_affinity) == ("least-loaded", 2.0, True)
    with pytest.raises(ProxyConfigError, match="--routing must be one of cache-aware"):
        ProxyConfig(routing="random")
    with pytest.raises(ProxyConfigError, match="--balance-rel must be >= 1"):
        ProxyConfig(balance_rel=0.5)
    with pytest.raises(ProxyConfigError, match="--prefix-capacity-tokens must be >= 1"):
        ProxyConfig(prefix_capacity_tokens=0)
    with pytest.raises(SystemExit):
        parse_args(["--routing", "random"])


# --- through the proxy -------------------------------------------------------------------------
PROMPT = "You are a helpful assistant. " * 20


def _completion(prompt: str) -> dict[str, object]:
    return {"model": "fake", "prompt": prompt, "max_tokens": 2}


def _sent(c: Cluster, role: str) -> list[int]:
    return [len(b.requests) for b in (c.p if role == "prefill" else c.d)]


ADMIN_TOKEN = "t" * 40  # the admin interface needs a token of at least 32 characters


def test_repeated_prompts_return_to_their_prefiller_with_metrics() -> None:
    async def t(c: Cluster) -> None:
        for _ in range(3):
            assert (await c.call("POST", "/v1/completions", _completion(PROMPT))).status == 200
        assert sorted(_sent(c, "prefill")) == [0, 3]
        assert sorted(_sent(c, "decode")) == [1, 2]  # decoders: still by load
        for reason, n in (("prefix_match", 2), ("no_match", 1), ("balance_override", 0)):
            line = f'kvpd_proxy_routing_decisions_total{{role="prefill",reason="{reason}"}}'
            assert c.metric(line) == n
        held = [c.metric(f'kvpd_proxy_prefix_index_chunks{{role="prefill",backend="{name}"}}')
                for name in ("prefill-0", "prefill-1")]  # fmt: skip
        assert sorted(held) == [0, 3]  # 580 characters: chunks of 128, 128, 256
        auth = {"authorization": f"Bearer {ADMIN_TOKEN}"}
        reset = await c.call("POST", "/admin/reset_prefix_cache", headers=auth)
        assert reset.status == 200  # the engines' caches are emptied: so is the index
        assert c.metric('kvpd_proxy_prefix_index_chunks{role="prefill",backend="prefill-0"}') == 0

    run_cluster(t, n_prefill=2, n_decode=2, admin_token=ADMIN_TOKEN)


def test_least_loaded_spreads_the_same_prompt() -> None:
    async def t(c: Cluster) -> None:
        for _ in range(4):
            assert (await c.call("POST", "/v1/completions", _completion(PROMPT))).status == 200
        assert _sent(c, "prefill") == [2, 2]
        with pytest.raises(KeyError):
            c.metric('kvpd_proxy_routing_decisions_total{role="prefill",reason="no_match"}')

    run_cluster(t, n_prefill=2, routing="least-loaded")


def test_mixed_engines_are_chosen_by_cache() -> None:
    async def t(c: Cluster) -> None:
        for prompt in (PROMPT, "Other text entirely. " * 20, PROMPT, PROMPT):
            assert (await c.call("POST", "/v1/completions", _completion(prompt))).status == 200
        assert sorted(_sent(c, "decode")) == [1, 3]
        line = 'kvpd_proxy_routing_decisions_total{role="decode",reason="prefix_match"}'
        assert c.metric(line) == 2

    run_cluster(t, n_prefill=0, n_decode=2, flow="mixed")


def test_decode_affinity_is_an_option() -> None:
    async def t(c: Cluster) -> None:
        for _ in range(3):
            assert (await c.call("POST", "/v1/completions", _completion(PROMPT))).status == 200
        assert sorted(_sent(c, "decode")) == [0, 3]

    run_cluster(t, n_prefill=1, n_decode=2, decode_affinity=True)


def test_layerwise_prefill_is_chosen_by_cache_after_the_decoder() -> None:
    async def t(c: Cluster) -> None:
        for _ in range(3):
            assert (await c.call("POST", "/v1/completions", _completion(PROMPT))).status == 200
        assert sorted(_sent(c, "prefill")) == [0, 3]
        assert sorted(_sent(c, "decode")) == [1, 2]  # the decoder, chosen first: by load

    run_cluster(t, n_prefill=2, n_decode=2, flow="layerwise")


def test_decode_affinity_returns_a_conversations_turns_to_its_decoder() -> None:
    def chat(*turns: str) -> dict[str, object]:
        roles = ("user", "assistant")
        messages = [{"role": roles[i % 2], "content": t} for i, t in enumerate(turns)]
        return {"model": "fake", "messages": messages, "max_tokens": 2}

    first, other = "Tell me about ships. " * 30, "Explain the tides. " * 30

    async def t(c: Cluster) -> None:
        for body in (chat(first), chat(other), chat(first, "Ships float.", "And boats?"),
                     chat(other, "The moon.", "Why twice a day?")):  # fmt: skip
            assert (await c.call("POST", "/v1/chat/completions", body)).status == 200
        for d in c.d:  # each decoder got one conversation, both of its turns
            contents = [body["messages"][0]["content"] for _, _, body in d.requests]
            assert len(contents) == 2
            assert contents[0] == contents[1]

    run_cluster(t, n_prefill=1, n_decode=2, decode_affinity=True)
