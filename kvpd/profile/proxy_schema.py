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
        "too loaded (on stand-in engines, the guide's seed-80%-then-full protocol hits 0.79 of "
        "the ideal 0.8 with 2 or 4 instances, least-loaded 0.47 and 0.15); least-loaded = the "
        "fewest outstanding tokens (unset: cache-aware)",
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
