"""The stand-in engine's prefix cache: whole blocks of chained hashes, and with a capacity the
least recently used blocks evicted first, as an engine's KV cache of limited size."""

from __future__ import annotations

from kvpd.testing.standin_engine import Engine


def _hits(engine: Engine) -> float:
    return sum(v for k, v in engine.counters.items() if k.startswith("vllm:prefix_cache_hits"))


def _prompt(tag: str, blocks: int) -> list[str]:
    return [f"{tag}{i}" for i in range(blocks * 2)]  # block size 2 below


def test_unbounded_cache_hits_every_repeat() -> None:
    e = Engine("prefill", "m", 2, "127.0.0.1", 1)
    e.admit(_prompt("a", 3), received=False)
    e.admit(_prompt("a", 3), received=False)
    assert _hits(e) == 6
    assert len(e.cache) == 3


def test_a_bounded_cache_evicts_the_least_recently_used_blocks() -> None:
    e = Engine("prefill", "m", 2, "127.0.0.1", 1, capacity=4)
    e.admit(_prompt("a", 2), received=False)
    e.admit(_prompt("b", 2), received=False)
    e.admit(_prompt("a", 2), received=False)  # hit: a's blocks are now the newest
    assert _hits(e) == 4
    e.admit(_prompt("c", 2), received=False)  # evicts b, the oldest
    assert len(e.cache) == 4
    e.admit(_prompt("b", 2), received=False)
    assert _hits(e) == 4  # b was gone
    e.admit(_prompt("c", 2), received=False)
    assert _hits(e) == 8  # c stayed
