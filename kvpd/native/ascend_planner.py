"""kvpd's native core behind vLLM-Ascend's sparse-offload planner interface.

A drop-in for the module vLLM-Ascend's `SparseKVOffloadManager` JIT-compiles as
`sparse_kv_offload_cpp`: the same two functions, the same arguments, caller-owned state and
in-place outputs, but prebuilt (no compiler, ninja or omp.h on the decode host), without libtorch,
and with the row planner chosen at load time for the CPU (AVX2 where the CPU has it, also on
AVX-512 CPUs, whose own paths run only when named: they vectorise the previous row algorithm and
are slower; NEON on aarch64; else baseline; `isa_choice` is that choice as a function). Rows go
to the calling thread and to helper threads that join when the OS runs them (no OpenMP team: no
barrier waiting for an unscheduled thread, no spinning between calls).

- `lru_resident_compact(req_ids, last_req_ids, topk, stable_prefix_lens, slot_to_token,
  lru_slots, current_slots, miss_count, miss_tokens, miss_slots, token_mark, token_pos, slot_ws,
  miss_pos, epochs, num_reqs, topk_len, capacity, max_token, workspace_threads,
  requested_threads)`: the first 15 arguments are raw addresses (`tensor.data_ptr()`), the rest
  ints. The five upstream workspaces are accepted and left untouched (kvpd's scratch is its own).
- `compute_lru_resident_addrs(miss_count, miss_tokens, miss_slots, block_table, block_size,
  tok_k, tok_v, gvas_k_base, gvas_v_base, addr_k_base, addr_v_base, capacity, max_threads,
  gvas, addr, size, num) -> S`: CPU tensors (torch or NumPy); K descriptors at [start_r + i],
  V at [S + start_r + i], sizes, and `num[0] = 2S` written in place.

Same results as upstream on valid inputs, with three deliberate differences:
1. addresses are computed in 64 bits (upstream's int32 `block_id * block_bytes` wraps once a
   block id reaches 2^31 / (block_size * token_bytes): 16384 for DeepSeek-V3.2 K at block 128);
2. descriptors of invalid misses (negative or out-of-table block, bad slot) are packed out and
   `num` counts only real copies (upstream leaves their address slots stale and still counts
   them);
3. a token repeated within one top-k row takes one slot that all its positions share, and is
   loaded once (upstream loads it into a separate slot per occurrence). Attention reads the same
   K/V either way; sharing saves copies and hot-buffer slots. The indexer's top-k rows hold
   distinct tokens, so in practice this never differs.

Both functions are the compiled core's own (the tensor checks of compute_lru_resident_addrs
included: they run for every layer of every step). Imports nothing else; ImportError when the
core is not built.
"""

from __future__ import annotations

from typing import Any

try:
    from kvpd.native._ascend_planner import (  # type: ignore[import-not-found]
        compute_lru_resident_addrs,
        isa_choice,
        isa_info,
        lru_resident_compact,
        pool_calls,
        pool_stats,
        set_isa,
    )
except ImportError as e:  # the plugin reports this and leaves vLLM-Ascend's own planner
    raise ImportError(
        f"kvpd's native planner core (kvpd.native._ascend_planner) is not available: {e}. "
        "The kvpd sparse-offload planner needs kvpd built with its C++ extension."
    ) from e

__all__ = [
    "compute_lru_resident_addrs",
    "isa_choice",
    "isa_info",
    "lru_resident_compact",
    "pool_calls",
    "pool_stats",
    "set_isa",
]


def implementation() -> dict[str, Any]:
    """The row planner's instruction set, what the CPU offers, OpenMP and processors."""
    return dict(isa_info())
