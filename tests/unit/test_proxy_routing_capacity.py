"""Each prefix index sized from its engine's reported cache (vllm:cache_config_info), with
what the engine says treated as untrusted, and the configured figure as the fallback."""

from __future__ import annotations

import asyncio

import pytest

from kvpd.proxy.backends import Backend, BackendPool
from kvpd.proxy.cache_aware import CacheAware, render
from kvpd.proxy.capacity import CapacityLearner, parse_capacity
from kvpd.proxy.hostpool import HostPool

pytestmark = pytest.mark.timeout(60)

# What vLLM's CPU build serves for local's engines (abridged: the real line has ~35 labels)
VLLM = (
    b"# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
    b"# TYPE vllm:cache_config_info gauge\n"
    b'vllm:cache_config_info{_block_size_resolved="True",block_size="32",cache_dtype="auto",'
    b'effective_attention_block_size="32",enable_prefix_caching="True",engine="0",'
    b'gpu_memory_utilization="0.92",hash_block_size="None",kv_cache_memory_bytes="16777216",'
    b'kv_cache_size_tokens="32768",mamba_block_size="None",num_cpu_blocks="None",'
    b'num_gpu_blocks="1024",prefix_caching_hash_algo="sha256"} 1.0\n'
)


def test_the_engines_block_count_and_size() -> None:
    assert parse_capacity(VLLM) == (1024, 32)
    # a server of two DP engines: the sum on each engine's line, taken once
    two = VLLM + VLLM.replace(b'engine="0"', b'engine="1"').split(b"\n", 2)[2]
    assert parse_capacity(two) == (1024, 32)


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b'vllm:num_requests_running{engine="0"} 0\n',
        VLLM.replace(b'num_gpu_blocks="1024"', b'num_gpu_blocks="None"'),  # not sized yet
        VLLM.replace(b'num_gpu_blocks="1024"', b'num_gpu_blocks="-5"'),
        VLLM.replace(b'num_gpu_blocks="1024"', b'num_gpu_blocks="0"'),
        VLLM.replace(b'num_gpu_blocks="1024"', b'num_gpu_blocks="1e9"'),
        VLLM.replace(b'num_gpu_blocks="1024"', b'num_gpu_blocks="99999999999999"'),
        VLLM.replace(b'block_size="32"', b'block_size="1048576"'),
        VLLM.replace(b'block_size="32",', b""),
        VLLM.replace(b'block_size="32"', b'block_size="32\\",num_gpu_blocks=\\"7"'),
        b'vllm:cache_config_info{block_size="32",num_gpu_blocks="' + b"9" * 20000 + b'"} 1\n',
        VLLM + b"#" * (9 << 20),  # larger than any /metrics page
    ],
    ids=[
        "empty",
        "other",
        "none",
        "negative",
        "zero",
        "float",
        "huge",
        "block",
        "missing",
        "escaped",
        "long-line",
        "large-body",
    ],  # fmt: skip
)
def test_what_an_engine_reports_is_validated(body: bytes) -> None:
    assert parse_capacity(body) is None


def test_a_label_escaped_inside_another_is_not_read() -> None:
    line = (
        b'vllm:cache_config_info{x="a\\"num_gpu_blocks=\\"9",num_gpu_blocks="8",block_size="4"} 1'
    )
    assert parse_capacity(line) == (8, 4)


class Engine:
    """A /metrics endpoint answering what the test sets (a real socket, HTTP/1.1)."""

    def __init__(self) -> None:
        self.status, self.body, self.asked = 200, VLLM, 0

    async def start(self) -> int:
        self.server = await asyncio.start_server(self.serve, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        self.asked += 1
        head = f"HTTP/1.1 {self.status} X\r\nContent-Length: {len(self.body)}\r\n"
        writer.write(head.encode() + b"Connection: close\r\n\r\n" + self.body)
        await writer.drain()
        writer.close()


def test_the_learner_sizes_each_index_from_its_engine() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        engines = [Engine(), Engine()]
        engines[1].body = VLLM.replace(b'num_gpu_blocks="1024"', b'num_gpu_blocks="junk"')
        ports = [await e.start() for e in engines]
        backends = [Backend(HostPool("127.0.0.1", p, loop, 1.0, f"prefill-{i}"))
                    for i, p in enumerate(ports)]  # fmt: skip
        pool = BackendPool("prefill", backends, loop)
        pool.policy = cache = CacheAware(backends, 500, 1, 100, 1.5)
        a, b = backends
        cache.indexes[a.name].insert(tuple(range(40)))  # 40 chunks: the 500 tokens are full
        learner = CapacityLearner([pool], b"")
        assert not await learner.refresh()  # both answered (b junk): none pending
        assert cache.indexes[a.name].capacity == 1024 * 32
        assert cache.sources[a.name] == "engine"
        assert cache.indexes[b.name].capacity == 500
        assert cache.sources[b.name] == "configured"
        assert not await learner.refresh()
        assert [e.asked for e in engines] == [1, 1]
        engines[1].body = VLLM.replace(b'num_gpu_blocks="1024"', b'num_gpu_blocks="2"')
        learner.learned.clear()  # what REFRESH_S later does
        assert not await learner.refresh()
        assert cache.indexes[b.name].capacity == 64  # 2 blocks of 32 tokens
        pool.mark_down(a, "refused")  # restarted, perhaps with other memory
        engines[0].body = VLLM.replace(b'num_gpu_blocks="1024"', b'num_gpu_blocks="1"')
        assert await learner.refresh()  # a is down: pending, not asked
        pool.mark_up(a)
        assert not await learner.refresh()
        index = cache.indexes[a.name]
        assert index.capacity == 32
        assert index.tokens <= 32
        engines[1].server.close()
        await engines[1].server.wait_closed()
        pool.mark_down(b, "refused")
        pool.mark_up(b)
        assert await learner.refresh()  # b does not answer: asked again in RETRY_S
        assert cache.indexes[b.name].capacity == 64  # kept as it was
        out: list[str] = []
        render((pool,), lambda *_: None, out)
        assert (
            'kvpd_proxy_prefix_index_capacity_tokens{role="prefill",backend="prefill-0",'
            'source="engine"} 32' in out
        )
        for e in engines:
            e.server.close()

    asyncio.run(main())
