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
        "measured (benchmarks/prefix_routing.py, stand-in engines): the guide's "
        "seed-80%-then-full protocol hits 0.797 with 2 and 4 instances (ideal 0.8; "
        "least-loaded 0.35 and 0.15), a shared system prompt stays balanced (requests max/mean "
        "<= 1.10), and random prompts cost 5-9% more proxy CPU at the same throughput and p99",
    )
    prefix_capacity_tokens: int | None = Field(
        None,
        ge=1,
        description="cache-aware: tokens of prompt prefixes the proxy remembers per instance, "
        "about its KV cache (vLLM logs it at start as GPU blocks x block size; unset: 1048576)",
    )
    decode_affinity: bool | None = Field(
        None,
        description="cache-aware: choose decoders by prompt prefix too, so a conversation's "
        "turns return to the decoder holding its earlier turns (unset: off, decoders by load)",
    )
