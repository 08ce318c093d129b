"""Cached prompt tokens as a client means them.

A decoder that received a request's KV from its prefiller counts those tokens as cached in
the usage it reports (`prompt_tokens_details.cached_tokens`; `input_tokens_details` in the
Responses API, `cache_read_input_tokens` in the Anthropic one), though the deployment computed
them moments before. A client means prefix-cache hits: what the prefill did not compute. The
proxy puts the prefill's figure into the decoder's answer as it passes, and counts the
difference (the hand-over) in `kvpd_proxy_kv_handoff_tokens_total`.

The figure is rewritten in place, padded with JSON whitespace to the same length, so the
framing (Content-Length, chunk sizes) relayed byte for byte stays right; a figure split across
two reads of the stream stays the decoder's."""

from __future__ import annotations

import re
from typing import Any

_FIGURE = re.compile(rb'"(cached_tokens|cache_read_input_tokens)":(\s*)(\d+)')


def prefill_cached_tokens(answer: dict[str, Any]) -> int:
    """The prefill's prefix-cache hits from its usage (0 when it reports none)."""
    usage = answer.get("usage")
    if not isinstance(usage, dict):
        return 0
    for details in ("prompt_tokens_details", "input_tokens_details"):
        d = usage.get(details)
        if isinstance(d, dict) and isinstance(d.get("cached_tokens"), int):
            return int(d["cached_tokens"])
    value = usage.get("cache_read_input_tokens")
    return value if isinstance(value, int) else 0


class CachedTokens:
    """Rewrites the decoder's cached-token figures to the prefill's, counting the hand-over."""

    __slots__ = ("value", "_text", "handoff")

    def __init__(self, value: int) -> None:
        self.value = value
        self._text = str(value).encode()
        self.handoff = 0  # the largest decoder figure minus the prefill's, seen so far

    def patch(self, data: bytes) -> bytes:
        return _FIGURE.sub(self._replace, data)

    def _replace(self, m: re.Match[bytes]) -> bytes:
        old = m.group(2) + m.group(3)
        new = self._text
        if len(new) > len(old):
            return m.group(0)  # cannot fit: the decoder's figure stays
        self.handoff = max(self.handoff, int(m.group(3)) - self.value)
        return b'"' + m.group(1) + b'":' + b" " * (len(old) - len(new)) + new
