"""kvpd's native core behind vLLM-Ascend's sparse-offload planner interface.

A drop-in for the module vLLM-Ascend's `SparseKVOffloadManager` JIT-compiles as
`sparse_kv_offload_cpp`: the same two functions, the same arguments, caller-owned state and
in-place outputs, but prebuilt (no compiler, ninja or omp.h on the decode host), without libtorch,
and with the row planner chosen at load time for the CPU (AVX-512 / AVX2 / baseline).

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

Imports only the standard library and the compiled core; ImportError when the core is not built.
"""

from __future__ import annotations

import operator
from typing import Any

try:
    from kvpd.native._ascend_planner import (  # type: ignore[import-not-found]
        compute_addrs_raw,
        isa_info,
        lru_resident_compact,
        set_isa,
    )
except ImportError as e:  # the plugin reports this and leaves vLLM-Ascend's own planner
    raise ImportError(
        f"kvpd's native planner core (kvpd.native._ascend_planner) is not available: {e}. "
        "The kvpd sparse-offload planner needs kvpd built with its C++ extension."
    ) from e

__all__ = ["compute_lru_resident_addrs", "isa_info", "lru_resident_compact", "set_isa"]

_U64 = 2**64


def _array(value: Any, name: str, dtypes: tuple[str, ...], ndim: int) -> tuple[int, tuple]:
    """(address, shape) of a C-contiguous CPU tensor or NumPy array with one of `dtypes`."""
    dtype = getattr(value, "dtype", None)
    if dtype is None:
        raise ValueError(f"{name} must be a CPU tensor or numpy array, got {type(value).__name__}")
    dname = str(dtype).removeprefix("torch.")
    if dname not in dtypes:
        raise ValueError(f"{name} must have dtype {' or '.join(dtypes)}, got {dname}")
    shape = tuple(value.shape)
    if len(shape) != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {shape}")
    if hasattr(value, "data_ptr"):  # torch.Tensor
        if value.device.type != "cpu":
            raise ValueError(f"{name} must be on the CPU, got device {value.device}")
        if not value.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
        return int(value.data_ptr()), shape
    flags = value.flags
    if not flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous")
    return int(value.ctypes.data), shape


def _int(value: Any, name: str, lo: int, hi: int) -> int:
    try:
        v = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be an integer, got {type(value).__name__}") from None
    if not lo <= v <= hi:
        raise ValueError(f"{name} must be in [{lo}, {hi}], got {v}")
    return v


def _writable(value: Any, name: str) -> None:
    flags = getattr(value, "flags", None)
    if flags is not None and not flags.writeable:
        raise ValueError(f"{name} is an output and must be writeable")


def compute_lru_resident_addrs(
    miss_count: Any,
    miss_tokens: Any,
    miss_slots: Any,
    block_table: Any,
    block_size: int,
    tok_k: int,
    tok_v: int,
    gvas_k_base: int,
    gvas_v_base: int,
    addr_k_base: int,
    addr_v_base: int,
    capacity: int,
    max_threads: int,
    gvas: Any,
    addr: Any,
    size: Any,
    num: Any,
) -> int:
    """Write the host->device copy descriptors of the planned misses in place; returns S."""
    mc_ptr, (mc_n,) = _array(miss_count, "miss_count", ("int32",), 1)
    mt_ptr, (rows, k) = _array(miss_tokens, "miss_tokens", ("int32",), 2)
    ms_ptr, ms_shape = _array(miss_slots, "miss_slots", ("int32",), 2)
    if ms_shape != (rows, k):
        raise ValueError(
            f"miss_slots must have the shape of miss_tokens {(rows, k)}, got {ms_shape}"
        )
    if mc_n < rows:
        raise ValueError(f"miss_count must have at least {rows} entries, got {mc_n}")
    bt_ptr, (bt_rows, bt_cols) = _array(block_table, "block_table", ("int32", "int64"), 2)
    if bt_rows < rows:
        raise ValueError(f"block_table must have at least {rows} rows, got {bt_rows}")
    bt64 = str(block_table.dtype).endswith("int64")
    need = 2 * rows * k
    outs = []
    for value, name, dtype in (
        (gvas, "gvas", "int64"),
        (addr, "addr", "int64"),
        (size, "size", "int32"),
    ):
        ptr, (n,) = _array(value, name, (dtype,), 1)
        if n < need:
            raise ValueError(f"{name} must have at least {need} entries (2 x rows x topk), got {n}")
        _writable(value, name)
        outs.append(ptr)
    num_ptr, (num_n,) = _array(num, "num", ("int32",), 1)
    if num_n < 1:
        raise ValueError("num must have at least 1 entry")
    _writable(num, "num")
    i32 = 2**31 - 1
    bases = [
        _int(b, n, 0, _U64 - 1)
        for b, n in (
            (gvas_k_base, "gvas_k_base"),
            (gvas_v_base, "gvas_v_base"),
            (addr_k_base, "addr_k_base"),
            (addr_v_base, "addr_v_base"),
        )
    ]
    return compute_addrs_raw(
        mc_ptr,
        mt_ptr,
        ms_ptr,
        rows,
        k,
        bt_ptr,
        bt_cols,
        bt64,
        _int(block_size, "block_size", 1, i32),
        _int(tok_k, "tok_k", 1, i32),
        _int(tok_v, "tok_v", 1, i32),
        *bases,
        _int(capacity, "capacity", 1, i32),
        _int(max_threads, "max_threads", -i32, i32),
        outs[0],
        outs[1],
        outs[2],
        num_ptr,
    )


def implementation() -> dict[str, Any]:
    """The row planner's instruction set, what the CPU offers, OpenMP and processors."""
    return dict(isa_info())
