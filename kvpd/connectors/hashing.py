"""Content-addressed, chained KV block keys that are stable across processes and hosts."""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvpd.connectors.store_folder import StoreConfigError

if TYPE_CHECKING:
    from vllm.v1.kv_cache_interface import KVCacheConfig

# Bump when the key derivation changes, so old stores are simply missed instead of misread.
KEY_SCHEME = "kvpd-store-key/1"


@dataclass(frozen=True, slots=True)
class StoreIdentity:
    """Everything that must match for two engines to share a KV block.

    Two engines produce byte-compatible blocks only if all of these agree; each one is folded
    into the root of every chain, so a mismatch gives disjoint keys (a miss), never wrong KV.
    """

    model: str  # the --model string as given (as UCM does); same path => same weights
    dtype: str  # KV cache dtype, e.g. "bfloat16"
    layout: str  # KV layout descriptor (layers, per-block shape, memory layout)
    block_size: int
    tp_size: int = 1

    def root(self, tp_rank: int = 0) -> bytes:
        """The parent hash of a request's first block for one tensor-parallel rank."""
        if not 0 <= tp_rank < self.tp_size:
            raise ValueError(f"tp_rank {tp_rank} outside tp_size {self.tp_size}")
        # JSON with sorted keys is a canonical encoding independent of Python's hash seed.
        meta = json.dumps(
            {
                "scheme": KEY_SCHEME,
                "model": self.model,
                "dtype": self.dtype,
                "layout": self.layout,
                "block_size": self.block_size,
                "tp_size": self.tp_size,
                "tp_rank": tp_rank,
            },
            sort_keys=True,
            separators=(",", ":"),
        )
        return hashlib.sha256(meta.encode()).digest()


def block_key(parent: bytes, token_ids: Sequence[int]) -> bytes:
    """sha256(parent || token ids as little-endian int64): one block's 32-byte key."""
    h = hashlib.sha256(parent)
    h.update(struct.pack(f"<{len(token_ids)}q", *token_ids))
    return h.digest()


def chain_keys(
    identity: StoreIdentity, token_ids: Sequence[int], tp_rank: int = 0, limit: int | None = None
) -> list[bytes]:
    """Keys of the full blocks of `token_ids` (a trailing partial block has no key).

    Block i's key depends on every token before it, so equal keys mean equal prefixes and any
    two prompts that share whole leading blocks share those keys.
    """
    bs = identity.block_size
    n = len(token_ids) // bs
    if limit is not None:
        n = min(n, limit)
    keys: list[bytes] = []
    parent = identity.root(tp_rank)
    for i in range(n):
        parent = block_key(parent, token_ids[i * bs : (i + 1) * bs])
        keys.append(parent)
    return keys


def describe_layout(kv_cache_config: KVCacheConfig) -> tuple[str, str, int]:
    """(layout descriptor, dtype, payload bytes per block) from the KV cache config.

    Both roles receive the same config, so both derive the same descriptor (it is part of the
    keys and of every file header).
    """
    groups = kv_cache_config.kv_cache_groups
    if len(groups) != 1:
        raise StoreConfigError(
            f"KvpdStoreConnector supports models with one KV cache group (plain full "
            f"attention); this model has {len(groups)}. Use another kv_connector for it."
        )
    spec = groups[0].kv_cache_spec
    layers = list(groups[0].layer_names)
    heads = getattr(spec, "num_kv_heads", None)
    head = getattr(spec, "head_size", None)
    dtype = str(getattr(spec, "dtype", "?")).removeprefix("torch.")
    layout = (
        f"{type(spec).__name__}:layers={len(layers)}:kv_heads={heads}:head_size={head}"
        f":block={spec.block_size}:page_bytes={spec.page_size_bytes}"
    )
    return layout, dtype, spec.page_size_bytes * len(layers)
