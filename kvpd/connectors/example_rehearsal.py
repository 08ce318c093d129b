"""vLLM's ExampleConnector as a CPU rehearsal runs it, its lookup keyed as its store is.

A STAND-IN's connector: a rehearsal replaces every KV connector that needs an NPU (UCM,
Mooncake, memcache) with vLLM's ExampleConnector over a folder all hosts share.

ExampleConnector (vLLM 0.32) keys a stored prompt by the hash of its first
`align(len(prompt))` tokens (`align(n)` = whole blocks of the first n - 1 tokens), and loads
from that same key, but its lookup (`_found_match_for_prompt`, and the count
`get_num_new_matched_tokens` returns) uses `align(len(prompt) - 1)`. The two differ for a prompt
one token longer than whole blocks (129 tokens at block 32: stored under 128, looked up under
96): such a prompt is never found, by another engine or DP rank, so it is computed again, and
the lookup's count runs a block short of the engine's own prefix cache: negative when the engine
already holds the prompt, on which vLLM's Prometheus logger raises and the API server stops.
Here lookup, count, store and load all use the store's key, so a stored prompt is found at any
length, and the count is never negative (an engine's own prefix cache reaches at most
`align(len(prompt))` tokens too).
"""

from __future__ import annotations

import os
from typing import Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import (
    ExampleConnector,
    align_to_block_size,
)


class KvpdExampleConnector(ExampleConnector):  # type: ignore[misc]
    """ExampleConnector that finds a prompt under the key it was stored and loaded by."""

    def _stored_tokens(self, prompt_token_ids: list[int]) -> int:
        """How many of the prompt's tokens a store of it writes (whole blocks, not the last)."""
        block: int = self._block_size
        return max(int(align_to_block_size(len(prompt_token_ids), block)), 0)

    def _found_match_for_prompt(self, prompt_token_ids: list[int], mm_hashes: list[str]) -> bool:
        n = self._stored_tokens(prompt_token_ids)
        if n == 0:
            return False
        folder = self._generate_foldername_debug(
            torch.tensor(prompt_token_ids)[:n], mm_hashes, create_folder=False
        )
        return os.path.exists(folder)

    def get_num_new_matched_tokens(
        self, request: Any, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        tokens = list(request.prompt_token_ids or [])
        n = self._stored_tokens(tokens)
        if n <= num_computed_tokens or not self._found_match_for_request(request):
            return 0, False
        return n - num_computed_tokens, False
