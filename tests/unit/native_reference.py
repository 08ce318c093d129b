"""Plain-Python reference of kvpd's SparseLRUPlanner and copy descriptors (test-only spec).

Written to follow the algorithm text step by step; the tests check the native core and the
NumPy fallback against it. Inputs are sequences of ints (or NumPy arrays), outputs lists.
"""

from __future__ import annotations

from collections.abc import Sequence


class ReferencePlanner:
    """Per-layer, per-row LRU residency of `capacity` hot-buffer slots."""

    def __init__(
        self, num_layers: int, max_rows: int, topk: int, capacity: int, max_model_len: int
    ) -> None:
        if capacity < topk:
            raise ValueError(f"capacity ({capacity}) must be >= topk ({topk})")
        self.num_layers, self.max_rows, self.topk = num_layers, max_rows, topk
        self.capacity, self.max_model_len = capacity, max_model_len
        self.reset()

    def reset(self) -> None:
        cells = [(layer, r) for layer in range(self.num_layers) for r in range(self.max_rows)]
        self.slot_to_token = {c: [-1] * self.capacity for c in cells}
        self.lru = {c: list(range(self.capacity)) for c in cells}  # least recently used first
        self.last_req = {c: -1 for c in cells}

    def plan(
        self,
        layer: int,
        topk_indices: Sequence[Sequence[int]],
        req_ids: Sequence[int],
        stable_prefix_lens: Sequence[int],
    ) -> tuple[list[list[int]], list[list[int]], list[list[int]], list[int]]:
        current, miss_tokens, miss_slots, miss_count = [], [], [], []
        for r, row in enumerate(topk_indices):
            cur, toks, slots = self._plan_row(
                (layer, r), [int(t) for t in row], int(req_ids[r]), int(stable_prefix_lens[r])
            )
            pad = [-1] * (self.topk - len(toks))
            current.append(cur)
            miss_tokens.append(toks + pad)
            miss_slots.append(slots + pad)
            miss_count.append(len(toks))
        return current, miss_tokens, miss_slots, miss_count

    def _plan_row(
        self, cell: tuple[int, int], row: list[int], req_id: int, stable_prefix_len: int
    ) -> tuple[list[int], list[int], list[int]]:
        slot_to_token = self.slot_to_token[cell]
        if self.last_req[cell] != req_id:
            slot_to_token[:] = [-1] * self.capacity
            self.lru[cell] = list(range(self.capacity))
            self.last_req[cell] = req_id
        stable = min(max(stable_prefix_len, 0), self.max_model_len)

        def valid(t: int) -> bool:
            return 0 <= t < self.max_model_len

        wanted = {t for t in row if valid(t)}
        hits, evictable, slot_of = [], [], {}
        for s in self.lru[cell]:
            t = slot_to_token[s]
            if t >= 0 and t >= stable:  # may be rewritten by speculative decoding
                slot_to_token[s] = t = -1
            if t >= 0 and t in wanted:
                hits.append(s)
                slot_of[t] = s
            else:
                evictable.append(s)
        current, miss_tokens, miss_slots = [], [], []
        for t in row:
            if not valid(t):
                current.append(-1)
                continue
            if t not in slot_of:
                s = evictable[len(miss_tokens)]
                slot_of[t] = s
                slot_to_token[s] = t
                miss_tokens.append(t)
                miss_slots.append(s)
            current.append(slot_of[t])
        m = len(miss_tokens)
        self.lru[cell] = evictable[m:] + evictable[:m] + hits
        return current, miss_tokens, miss_slots


def reference_copy_descriptors(
    miss_tokens: Sequence[Sequence[int]],
    miss_slots: Sequence[Sequence[int]],
    miss_count: Sequence[int],
    block_table: Sequence[Sequence[int]],
    block_size: int,
    src_base_k: int,
    src_base_v: int,
    dst_base_k: int,
    dst_base_v: int,
    token_bytes_k: int,
    token_bytes_v: int,
    capacity: int,
) -> tuple[list[int], list[int], list[int]]:
    """(src, dst, sizes): K entries of all rows, then V; invalid entries left out. Python ints,
    so addresses are exact (the caller compares them with uint64 results)."""
    k_src, k_dst, v_src, v_dst = [], [], [], []
    for r, (toks, slots) in enumerate(zip(miss_tokens, miss_slots, strict=True)):
        n = min(max(int(miss_count[r]), 0), len(toks))
        for t, s in zip(toks[:n], slots[:n], strict=True):
            t, s = int(t), int(s)
            if t < 0 or not 0 <= s < capacity or t // block_size >= len(block_table[r]):
                continue
            blk = int(block_table[r][t // block_size])
            if blk < 0:
                continue
            src_tok = blk * block_size + t % block_size
            dst_tok = r * capacity + s
            k_src.append(src_base_k + src_tok * token_bytes_k)
            k_dst.append(dst_base_k + dst_tok * token_bytes_k)
            v_src.append(src_base_v + src_tok * token_bytes_v)
            v_dst.append(dst_base_v + dst_tok * token_bytes_v)
    n = len(k_src)
    return k_src + v_src, k_dst + v_dst, [token_bytes_k] * n + [token_bytes_v] * n
