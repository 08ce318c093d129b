"""The routing options of the profile's `proxy:` (kvpd's proxy only; kvpd/proxy/cache_aware.py).
Unset fields leave the proxy at its defaults."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from kvpd.profile.base import _Model


class ProxyRouting(_Model):
    routing: Literal["cache-aware", "least-loaded"] | None = Field(
        None,
        description="how kvpd's proxy chooses a prefill instance (a mixed engine): "
        "cache-aware = the one already sent the longest prefix of the prompt unless it is "
        "too loaded; least-loaded = the fewest outstanding tokens. Unset: cache-aware, as "
        "measured side by side: the guide's seed-80%-then-full protocol hits 0.80 on CPU vLLM "
        "with 2 prefill instances at 0.67x the TTFT (least-loaded 0.55; "
        "benchmarks/prefix_routing_vllm.py) "
        "and 0.797 on stand-in engines with 2 and 4 (least-loaded 0.38 and 0.23; "
        "benchmarks/prefix_routing.py), a shared system prompt stays balanced (requests "
        "max/mean <= 1.16), and random prompts cost about 5% more proxy CPU at the same "
        "throughput and p99",
    )
    prefix_capacity_tokens: int | None = Field(
        None,
        ge=1,
        description="cache-aware: tokens of prompt prefixes the proxy remembers per instance "
        "until its engine reports its real cache (num_gpu_blocks x block_size from "
        "vllm:cache_config_info on /metrics, which then replaces this); unset: what `kvpd plan` "
        "derives from engine.kv_cache_memory_bytes, else 1048576",
    )
    decode_affinity: bool | None = Field(
        None,
        description="cache-aware: choose decoders by prompt prefix too, so a conversation's "
        "turns return to the decoder holding its earlier turns (unset: off, decoders by load)",
    )
