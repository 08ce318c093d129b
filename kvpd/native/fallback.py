"""Pure-NumPy sparse-KV LRU planner and copy descriptors: the native core's results, slower.

Used when kvpd.native._sparse_lru is not built (no compiler/OpenMP) or KVPD_NATIVE=0. Rows are
planned one at a time with vectorised operations inside each row.
"""

from __future__ import annotations

import numpy as np

from kvpd.native.checks import (
    _I32_MAX,
    check_address,
    check_array,
    check_int,
    check_planner_sizes,
)


class SparseLRUPlanner:
    """Per-layer, per-row LRU residency of `capacity` hot-buffer slots (NumPy)."""

    def __init__(
        self,
        num_layers: int,
        max_rows: int,
        topk: int,
        capacity: int,
        max_model_len: int,
        num_threads: int = 0,
    ) -> None:
        nl, rows, k, cap, mml, nt = check_planner_sizes(
            num_layers, max_rows, topk, capacity, max_model_len, num_threads
        )
        self.num_layers, self.max_rows, self.topk = nl, rows, k
        self.capacity, self.max_model_len = cap, mml
        self.num_threads = nt or 1  # accepted for API parity; NumPy runs on one thread
        self._slot_to_token = np.empty((nl, rows, cap), dtype=np.int32)
        self._lru = np.empty((nl, rows, cap), dtype=np.int32)
        self._last_req = np.empty((nl, rows), dtype=np.int64)
        # token -> slot scratch: -1 not in this row's top-k, -2 wanted without a slot yet.
        # Index max_model_len is the target of empty slots and stays -1.
        self._slot_of = np.full(mml + 1, -1, dtype=np.int32)
        self._identity = np.arange(cap, dtype=np.int32)
        self.reset()

    def reset(self) -> None:
        self._slot_to_token.fill(-1)
        self._lru[:] = self._identity
        self._last_req.fill(-1)

    def plan(
        self,
        layer: int,
        topk_indices: np.ndarray,
        req_ids: np.ndarray,
        stable_prefix_lens: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        layer = check_int(layer, "layer", 0, self.num_layers - 1)
        topk = check_array(topk_indices, "topk_indices", 2, np.int32)
        rows = topk.shape[0]
        if rows > self.max_rows or topk.shape[1] != self.topk:
            raise ValueError(
                f"topk_indices must have shape (rows, {self.topk}) with rows <= "
                f"{self.max_rows}, got {topk.shape}"
            )
        req = check_array(req_ids, "req_ids", 1, np.int64)
        if req.shape[0] != rows:
            raise ValueError(
                f"req_ids must have shape ({rows},) like topk_indices' rows, got {req.shape}"
            )
        stable = check_array(stable_prefix_lens, "stable_prefix_lens", 1, np.int32)
        if stable.shape[0] != rows:
            raise ValueError(
                f"stable_prefix_lens must have shape ({rows},) like topk_indices' rows, "
                f"got {stable.shape}"
            )
        current = np.full((rows, self.topk), -1, dtype=np.int32)
        miss_tokens = np.full((rows, self.topk), -1, dtype=np.int32)
        miss_slots = np.full((rows, self.topk), -1, dtype=np.int32)
        miss_count = np.zeros(rows, dtype=np.int32)
        valid = (topk >= 0) & (topk < self.max_model_len)
        stable_c = np.clip(stable, 0, self.max_model_len)
        for r in range(rows):
            m = self._plan_row(
                layer,
                r,
                topk[r],
                valid[r],
                int(req[r]),
                int(stable_c[r]),
                current[r],
                miss_tokens[r],
                miss_slots[r],
            )
            miss_count[r] = m
        return current, miss_tokens, miss_slots, miss_count

    def _plan_row(
        self,
        layer: int,
        r: int,
        row: np.ndarray,
        valid: np.ndarray,
        req_id: int,
        stable: int,
        current: np.ndarray,
        miss_tokens: np.ndarray,
        miss_slots: np.ndarray,
    ) -> int:
        s2t = self._slot_to_token[layer, r]
        lru = self._lru[layer, r]
        if self._last_req[layer, r] != req_id:
            s2t.fill(-1)
            lru[:] = self._identity
            self._last_req[layer, r] = req_id
        slot_of = self._slot_of
        toks = s2t[lru]
        stale = toks >= stable  # resident speculative tokens; empty slots (-1) never match
        if stale.any():
            s2t[lru[stale]] = -1
            toks[stale] = -1
        pos = np.flatnonzero(valid)
        vt = row[pos]
        slot_of[vt] = -2
        toks[toks < 0] = self.max_model_len
        hit = slot_of[toks] == -2
        hits = lru[hit]
        evictable = lru[~hit]
        slot_of[toks[hit]] = hits
        missing = vt[slot_of[vt] == -2]
        if missing.size > 1:
            # Duplicates get one slot: keep each token's first occurrence, in top-k order.
            _, first = np.unique(missing, return_index=True)
            if first.size != missing.size:
                missing = missing[np.sort(first)]
        m = missing.size
        filled = evictable[:m]
        slot_of[missing] = filled
        s2t[filled] = missing
        current[pos] = slot_of[vt]
        miss_tokens[:m] = missing
        miss_slots[:m] = filled
        lru[:] = np.concatenate((evictable[m:], filled, hits))
        slot_of[vt] = -1
        return int(m)


def build_copy_descriptors(
    miss_tokens: np.ndarray,
    miss_slots: np.ndarray,
    miss_count: np.ndarray,
    block_table: np.ndarray,
    block_size: int,
    src_base_k: int,
    src_base_v: int,
    dst_base_k: int,
    dst_base_v: int,
    token_bytes_k: int,
    token_bytes_v: int,
    capacity: int,
    num_threads: int = 0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(src, dst, sizes) uint64: K entries of all rows, then V; invalid entries left out."""
    mt = check_array(miss_tokens, "miss_tokens", 2, np.int32)
    ms = check_array(miss_slots, "miss_slots", 2, np.int32)
    if ms.shape != mt.shape:
        raise ValueError(
            f"miss_slots must have the shape of miss_tokens {mt.shape}, got {ms.shape}"
        )
    rows, k = mt.shape
    mc = check_array(miss_count, "miss_count", 1, np.int32)
    if mc.shape[0] != rows:
        raise ValueError(
            f"miss_count must have shape ({rows},) like miss_tokens' rows, got {mc.shape}"
        )
    if not isinstance(block_table, np.ndarray):
        raise ValueError("block_table must be a numpy.ndarray of dtype int32 or int64")
    bt_dtype = np.int64 if block_table.dtype == np.int64 else np.int32
    bt = check_array(block_table, "block_table", 2, bt_dtype)
    if bt.shape[0] < rows:
        raise ValueError(
            f"block_table must have at least {rows} rows (one per miss_tokens row), "
            f"got shape {bt.shape}"
        )
    bs = check_int(block_size, "block_size", 1, _I32_MAX)
    bases = [
        np.uint64(check_address(v, n))
        for v, n in (
            (src_base_k, "src_base_k"),
            (src_base_v, "src_base_v"),
            (dst_base_k, "dst_base_k"),
            (dst_base_v, "dst_base_v"),
        )
    ]
    tok_k = np.uint64(check_int(token_bytes_k, "token_bytes_k", 1, _I32_MAX))
    tok_v = np.uint64(check_int(token_bytes_v, "token_bytes_v", 1, _I32_MAX))
    cap = check_int(capacity, "capacity", 1, _I32_MAX)
    check_int(num_threads, "num_threads", 0, 1024)

    n = np.clip(mc, 0, k)
    r, i = np.nonzero(np.arange(k)[None, :] < n[:, None])  # row-major: rows in order
    t = mt[r, i].astype(np.int64)
    s = ms[r, i].astype(np.int64)
    b = t // bs
    ok = (t >= 0) & (s >= 0) & (s < cap) & (b < bt.shape[1])
    r, t, s, b = r[ok], t[ok], s[ok], b[ok]
    blk = bt[r, b].astype(np.int64)
    ok = blk >= 0
    r, t, s, blk = r[ok], t[ok], s[ok], blk[ok]
    src_tok = blk.astype(np.uint64) * np.uint64(bs) + (t % bs).astype(np.uint64)
    dst_tok = r.astype(np.uint64) * np.uint64(cap) + s.astype(np.uint64)
    src = np.concatenate((bases[0] + src_tok * tok_k, bases[1] + src_tok * tok_v))
    dst = np.concatenate((bases[2] + dst_tok * tok_k, bases[3] + dst_tok * tok_v))
    sizes = np.concatenate(
        (np.full(t.size, tok_k, dtype=np.uint64), np.full(t.size, tok_v, dtype=np.uint64))
    )
    return src, dst, sizes
