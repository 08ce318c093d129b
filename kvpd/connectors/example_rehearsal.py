"""vLLM's ExampleConnector as a CPU rehearsal runs it, without its negative hit count.

A STAND-IN's connector: a rehearsal replaces every KV connector that needs an NPU (UCM,
Mooncake, memcache) with vLLM's ExampleConnector over a folder all hosts share.

ExampleConnector.get_num_new_matched_tokens (vLLM 0.32) returns the prompt's length minus one,
rounded down to whole blocks as it rounds, minus the locally computed tokens. When the prompt
is one token longer than a whole number of blocks and is already in the engine's own prefix
cache (a prompt sent again, as `kvpd bench --protocol twice` does), the local hit is a block
longer than that and the result is negative. vLLM's Prometheus logger then raises on the
negative counter increment and the API server stops. Here a negative count is no external hit:
the engine's own prefix cache already holds more than the folder would give.
"""

from __future__ import annotations

from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import ExampleConnector


class KvpdExampleConnector(ExampleConnector):  # type: ignore[misc]
    """ExampleConnector whose external hit count is never negative."""

    def get_num_new_matched_tokens(
        self, request: Any, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        n, load_async = super().get_num_new_matched_tokens(request, num_computed_tokens)
        if n is not None and n < 0:
            return 0, False
        return n, load_async
