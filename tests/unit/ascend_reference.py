"""Plain-Python reference of vLLM-Ascend's sparse-offload planner, from the description in
shared/reference/vllm-ascend.md §2 (not from upstream code), for kvpd.native.ascend_planner.

State and outputs are NumPy arrays in upstream's layout, changed in place like the interface does.
`share_duplicates` selects kvpd's choice for a token repeated in one top-k row (one slot shared by
its positions) instead of the description's (a slot per occurrence). Descriptor addresses are
Python ints (exact, i.e. 64-bit) and invalid entries are packed out: kvpd's two deviations.
"""

from __future__ import annotations

import numpy as np


def lru_resident_compact(
    req_ids: np.ndarray,
    last_req_ids: np.ndarray,
    topk: np.ndarray,
    stable_prefix_lens: np.ndarray,
    slot_to_token: np.ndarray,
    lru_slots: np.ndarray,
    current_slots: np.ndarray,
    miss_count: np.ndarray,
    miss_tokens: np.ndarray,
    miss_slots: np.ndarray,
    num_reqs: int,
    capacity: int,
    max_token: int,
    share_duplicates: bool = True,
) -> None:
    for r in range(num_reqs):
        _row(
            r,
            int(req_ids[r]),
            last_req_ids,
            [int(t) for t in topk[r]],
            int(stable_prefix_lens[r]),
            slot_to_token[r],
            lru_slots[r],
            current_slots[r],
            miss_count,
            miss_tokens[r],
            miss_slots[r],
            capacity,
            max_token,
            share_duplicates,
        )


# Exempt from C901: the reference is the description's eight numbered steps in one place, read side
# by side with §2 when auditing the native planner; split into helpers they would no longer read
# in order, and each would take most of the row's state as arguments.
def _row(r, req, last, row, stable_in, stt, lru, cur, mc, mt, ms, cap, max_token, share) -> None:  # noqa: C901 — the description's steps 1-8 in order, one place
    def valid(t: int) -> bool:
        return 0 <= t < max_token

    # 1. clear the outputs
    cur[:] = -1
    mt[:] = -1
    ms[:] = -1
    mc[r] = 0
    # 2. a new request resets the row
    if int(last[r]) != req:
        stt[:] = -1
        lru[:] = np.arange(cap)
        last[r] = req
    # 3. stable prefix
    stable = min(max(stable_in, 0), max_token)
    # 4. mark the top-k set; the first occurrence of a token wins
    pos: dict[int, int] = {}
    for p, t in enumerate(row):
        if valid(t) and t not in pos:
            pos[t] = p
    # 5. walk the LRU order. An entry that is no slot index (only in corrupt state; the
    # description is silent) is skipped: kvpd's choice, and upstream's planner's.
    hits, evictable = [], []
    for s in (int(x) for x in lru if 0 <= x < cap):
        t = int(stt[s])
        if valid(t) and t >= stable:
            stt[s] = -1
            t = -1
        if valid(t) and t in pos:
            cur[pos[t]] = s
            hits.append(s)
        else:
            evictable.append(s)
    # 6. misses in top-k order
    misses: list[tuple[int, int]] = []
    first_miss: dict[int, int] = {}
    later: list[tuple[int, int]] = []  # (position, token) sharing an earlier occurrence
    for p, t in enumerate(row):
        if not valid(t):
            continue
        if share and t in pos and cur[pos[t]] >= 0 and pos[t] != p:
            later.append((p, t))  # a hit's duplicate shares the hit's slot
            continue
        if cur[p] >= 0:
            continue
        if share and t in first_miss:
            later.append((p, t))
            continue
        first_miss[t] = len(misses)
        misses.append((t, p))
    # 7. assign misses to the oldest evictable slots
    n = min(len(misses), len(evictable))
    for i in range(n):
        s = evictable[i]
        t, p = misses[i]
        stt[s] = t
        cur[p] = s
        ms[i] = s
        mt[i] = t
        mc[r] = i + 1
    for p, t in later:
        cur[p] = cur[pos[t]]
    # 8. new LRU order (shorter than the row only when entries were skipped; the rest of the
    # row keeps its old entries)
    order = evictable[n:] + evictable[:n] + hits
    lru[: len(order)] = order


def compute_lru_resident_addrs(
    miss_count, miss_tokens, miss_slots, block_table, block_size, tok_k, tok_v,
    gvas_k_base, gvas_v_base, addr_k_base, addr_v_base, capacity,
) -> tuple[list[int], list[int], list[int], int]:  # fmt: skip
    """(gvas[:2S], addr[:2S], size[:2S], S) with exact addresses and invalid entries left out."""
    ks, kd, vs, vd = [], [], [], []
    rows, k = miss_tokens.shape
    blocks = block_table.shape[1]
    for r in range(rows):
        for i in range(min(max(int(miss_count[r]), 0), k)):
            t, s = int(miss_tokens[r, i]), int(miss_slots[r, i])
            if t < 0 or not 0 <= s < capacity or t // block_size >= blocks:
                continue
            blk = int(block_table[r, t // block_size])
            if blk < 0:
                continue
            off = t % block_size
            ks.append(gvas_k_base + blk * block_size * tok_k + off * tok_k)
            vs.append(gvas_v_base + blk * block_size * tok_v + off * tok_v)
            kd.append(addr_k_base + (r * capacity + s) * tok_k)
            vd.append(addr_v_base + (r * capacity + s) * tok_v)
    n = len(ks)
    return ks + vs, kd + vd, [tok_k] * n + [tok_v] * n, n
