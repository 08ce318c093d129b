// SPDX-License-Identifier: Apache-2.0
// One row of lru_resident_compact, in phases that every ISA variant shares. The functions are
// always_inline so that each variant (compiled with its own target attribute) gets its own copy
// optimised for its instruction set; the AVX-512 variant replaces the walk and resolve loops
// and falls back to these for tails and rare cases.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#define KVPD_INLINE inline __attribute__((always_inline))
#define KVPD_LAMBDA_INLINE __attribute__((always_inline))
// A split point inside a phase, for the instrumented build of
// benchmarks/ascend_planner_phases.cpp (which defines it); nothing otherwise.
#ifndef KVPD_PHASE
#define KVPD_PHASE(i)
#endif

namespace kvpd_ascend {

// One row's inputs, caller-owned state and in-place outputs (upstream layout and dtypes).
struct RowIO {
  const int32_t* topk;  // [k] token positions; outside [0, max_token) is padding
  int64_t req_id;
  int32_t stable_in;       // stable prefix length; resident tokens at or past it are dropped
  int64_t* last_req_id;    // state: the request this row's residency belongs to
  int32_t* slot_to_token;  // state [c]: token held by each slot, -1 empty
  int32_t* lru;            // state [c]: slots, least recently used first
  int32_t* current_slots;  // out [k]: slot of each top-k position, -1 for padding
  int32_t* miss_tokens;    // out [k]: tokens to load, packed, -1 after miss_count
  int32_t* miss_slots;     // out [k]: their slots, packed, -1 after miss_count
  int32_t* miss_count;     // out [1]
  int32_t k, c, max_token;
  // The next row's state, top-k and outputs (next_stt nullptr: none), fetched into L2 while
  // this row is planned.
  const int32_t* next_stt = nullptr;
  const int32_t* next_lru = nullptr;
  const int32_t* next_topk = nullptr;
  const int32_t* next_cur = nullptr;
  const int32_t* next_mt = nullptr;
  const int32_t* next_ms = nullptr;
};

// Per-thread scratch. `bits<W>()` is a bitmap over token ids in words of type W (all-zero between
// rows); `rank_base[w]` counts marked tokens in words before w, so a marked token's rank among
// the row's distinct top-k tokens is rank_base[w] + popcount(lower bits of word w), and
// `slot_of_rank` maps a rank to its slot (-1: not resident). 16 KiB of bitmap for 128k tokens
// stays in L1, where upstream's two max_token-sized int32 tables (1 MiB) do not. Buffers carry
// 16 entries of slack so SIMD code may store whole vectors.
//
// Two bitmaps of the same tokens, each used by its own row planners: 64-bit words on the
// portable paths (baseline, AVX2, NEON, SVE): half the words of 32-bit ones, so the rank prefix
// runs half as many steps (1,800 instead of 2,800 ticks a row on Zen 4) and the part of
// rank_base a row uses takes half the L1; 32-bit words on the AVX-512 paths, whose gathers read
// 32-bit lanes.
//
// A bitmap starts one word into its vector: that word stays zero, so an empty slot's token
// (-1, shifted right arithmetically to word -1) tests as "not in the set" with no test of its own.
struct Workspace {
  std::vector<uint32_t> mark_words, rank_base;
  std::vector<uint64_t> mark_words64;
  std::vector<int32_t> slot_of_rank, hits;
  std::vector<uint32_t> hit_tokens;  // walk_scalar: the tokens of `hits`
  std::vector<uint16_t> hit_slots;  // a bit per slot, 16 per entry
  std::vector<int32_t> miss_pos;     // resolve_distinct: positions that missed

  template <typename W>
  W* bits();

  void fit(int64_t max_token, int64_t topk, int64_t capacity) {
    const size_t words = static_cast<size_t>(max_token >> 5) + 2;  // rank_base: either width
    if (rank_base.size() < words) {
      mark_words.assign(words + 1, 0);
      mark_words64.assign(static_cast<size_t>(max_token >> 6) + 3, 0);
      rank_base.assign(words, 0);
    }
    if (slot_of_rank.size() < static_cast<size_t>(topk) + 16) {
      slot_of_rank.resize(topk + 16);
      miss_pos.resize(topk + 16);
    }
    if (hits.size() < static_cast<size_t>(capacity) + 16) {
      hits.resize(capacity + 16);
      hit_tokens.resize(capacity + 16);
      hit_slots.resize(static_cast<size_t>(capacity / 16) + 2);  // +1: 32-bit gather reads
    }
  }
};

template <>
inline uint32_t* Workspace::bits<uint32_t>() {
  return mark_words.data() + 1;
}
template <>
inline uint64_t* Workspace::bits<uint64_t>() {
  return mark_words64.data() + 1;
}

// log2 of a bitmap word's bits: token t is bit t % bits of word t >> kWordShift<W>.
template <typename W>
constexpr uint32_t kWordShift = sizeof(W) == 8 ? 6 : 5;
template <typename W>
constexpr uint32_t kBitMask = (1u << kWordShift<W>) - 1;

KVPD_INLINE uint32_t popcount(uint32_t w) { return static_cast<uint32_t>(__builtin_popcount(w)); }
KVPD_INLINE uint32_t popcount(uint64_t w) {
  return static_cast<uint32_t>(__builtin_popcountll(w));
}

// n + bit b (mod the word's bits) of w. On x86 BT and ADC: a shift by a variable count is two or
// three micro-ops on Intel cores without BMI2 (the baseline path), and BT's result as a value
// would take a SETC and a zero extension before the add. Elsewhere the compiler's shift is as
// good.
KVPD_INLINE int64_t add_bit(int64_t n, uint32_t w, uint32_t b) {
#if defined(__x86_64__)
  asm("btl %2, %1\n\tadcq $0, %0" : "+r"(n) : "r"(w), "r"(b) : "cc");
  return n;
#else
  return n + ((w >> (b & 31)) & 1);
#endif
}
KVPD_INLINE int64_t add_bit(int64_t n, uint64_t w, uint64_t b) {
#if defined(__x86_64__)
  asm("btq %2, %1\n\tadcq $0, %0" : "+r"(n) : "r"(w), "r"(b) : "cc");
  return n;
#else
  return n + static_cast<int64_t>((w >> (b & 63)) & 1);
#endif
}

// w with bit b (mod the word's bits) set: one BTS on x86 (see add_bit).
KVPD_INLINE uint32_t with_bit(uint32_t w, uint32_t b) {
#if defined(__x86_64__)
  asm("btsl %1, %0" : "+r"(w) : "r"(b) : "cc");
  return w;
#else
  return w | (1u << (b & 31));
#endif
}
KVPD_INLINE uint64_t with_bit(uint64_t w, uint64_t b) {
#if defined(__x86_64__)
  asm("btsq %1, %0" : "+r"(w) : "r"(b) : "cc");
  return w;
#else
  return w | (uint64_t{1} << (b & 63));
#endif
}

template <typename W>
KVPD_INLINE uint32_t rank_of(const W* mark, const uint32_t* rank_base, uint32_t t) {
  const uint32_t w = t >> kWordShift<W>;
  return rank_base[w] + popcount(static_cast<W>(mark[w] & ((W{1} << (t & kBitMask<W>)) - 1)));
}

// What begin_row learns about the row's top-k set.
struct RowMarks {
  int32_t stable;      // clamped stable prefix
  uint32_t last_word;  // last bitmap word used (cleared afterwards)
  bool duplicates;     // a token occurs more than once among the valid positions
};

// Reset on a new request and mark this step's top-k set in the bitmap. The ranks come next
// (rank_prefix_scalar or a SIMD variant).
KVPD_INLINE void reset_on_new_request(const RowIO& io) {
  if (*io.last_req_id != io.req_id) {
    std::fill(io.slot_to_token, io.slot_to_token + io.c, -1);
    for (int32_t s = 0; s < io.c; ++s) io.lru[s] = s;
    *io.last_req_id = io.req_id;
  }
}

template <typename W>
KVPD_INLINE RowMarks mark_row(const RowIO& io, Workspace& ws, uint32_t* n_valid) {
  reset_on_new_request(io);
  // Locals, so that the bitmap stores cannot alias them in the compiler's eyes.
  W* __restrict__ mark = ws.bits<W>();
  const int32_t* __restrict__ topk = io.topk;
  const int32_t k = io.k;
  const uint32_t umax = static_cast<uint32_t>(io.max_token);
  uint32_t last_word = 0, valid = 0;
  for (int32_t p = 0; p < k; ++p) {
    const uint32_t t = static_cast<uint32_t>(topk[p]);
    if (t < umax) {
      const uint32_t w = t >> kWordShift<W>;
      // An OR into memory (one instruction, a shift by BMI2's SHLX on the AVX2 path) rather
      // than a load, BTS and a store. Measured on Zen 5 with the descriptor pass of the same
      // commit: both paths faster together; alone, its effect on either path moved with where
      // the loops were placed (docs/native-planner.md).
      mark[w] |= W{1} << (t & kBitMask<W>);
      last_word = std::max(last_word, w);
      ++valid;
    }
  }
  *n_valid = valid;
  return {std::min(std::max(io.stable_in, 0), io.max_token), last_word, false};
}

// rank_base[w] = marked tokens in words before w, for w <= last_word; returns the total.
template <typename W>
KVPD_INLINE uint32_t rank_prefix_scalar(Workspace& ws, uint32_t last_word) {
  const W* __restrict__ mark = ws.bits<W>();
  uint32_t* __restrict__ rank_base = ws.rank_base.data();
  uint32_t distinct = 0;
  for (uint32_t w = 0; w <= last_word; ++w) {
    rank_base[w] = distinct;
    distinct += popcount(mark[w]);
  }
  return distinct;
}

KVPD_INLINE void begin_ranks(Workspace& ws, RowMarks* marks, uint32_t n_valid, uint32_t distinct) {
  marks->duplicates = distinct < n_valid;
  std::fill(ws.slot_of_rank.data(), ws.slot_of_rank.data() + distinct, -1);
}

// The AVX-512 path splits the walk below in two passes, because its gathers of slot_to_token in
// LRU order cost more than reading it in sequence: pass A, in slot order from slot s, drops a
// resident token at or past the stable prefix and gives each hit its slot
// (slot_of_rank[rank(token)] = slot), noting hit slots in `hit_slots`; pass B splits the LRU
// order from the bitmap. The state this planner produces never holds a token in two slots, so
// slot order and LRU order give the same result (on corrupt state they may differ). These are
// the scalar forms, for its tails.
KVPD_INLINE void classify_slots_scalar(const RowIO& io, Workspace& ws, int32_t stable,
                                       int32_t s) {
  const uint32_t* __restrict__ mark = ws.bits<uint32_t>();
  const uint32_t* __restrict__ rank_base = ws.rank_base.data();
  int32_t* __restrict__ sor = ws.slot_of_rank.data();
  uint16_t* __restrict__ hit_slots = ws.hit_slots.data();
  int32_t* __restrict__ stt = io.slot_to_token;
  const uint32_t umax = static_cast<uint32_t>(io.max_token);
  const uint32_t ustable = static_cast<uint32_t>(stable);  // stable in [0, max_token]
  const uint32_t trash = static_cast<uint32_t>(io.k);      // slot_of_rank has slack past k
  const int32_t c = io.c;
  uint32_t bits = s & 15 ? hit_slots[s >> 4] : 0;  // the group of 16 slots being filled
  for (; s < c; ++s) {
    const uint32_t t = static_cast<uint32_t>(stt[s]);
    if (t < umax && t >= ustable) stt[s] = -1;  // rare: one token per row and step
    // Branch-free from here (see walk_scalar).
    const uint32_t valid = static_cast<uint32_t>(t < ustable);
    const uint32_t ti = t & (0u - valid);
    const uint32_t word = mark[ti >> 5];
    const uint32_t hit = valid & (word >> (ti & 31));
    const uint32_t rank = rank_base[ti >> 5] +
                          static_cast<uint32_t>(__builtin_popcount(word & ((1u << (ti & 31)) - 1)));
    sor[rank + ((trash - rank) & (hit - 1))] = s;  // hit ? rank : trash
    bits |= hit << (s & 15);
    if ((s & 15) == 15) {  // one store per 16 slots, not a read-modify-write per slot
      hit_slots[s >> 4] = static_cast<uint16_t>(bits);
      bits = 0;
    }
  }
  if (c & 15) hit_slots[c >> 4] = static_cast<uint16_t>(bits);
}

// Pass B, in LRU order from entry i: hits are set aside and every other slot is evictable,
// compacted in place at the front of `lru`, both in LRU order (out-of-range entries skipped).
KVPD_INLINE void split_lru_scalar(const RowIO& io, Workspace& ws, int32_t i, int32_t* n_evict,
                                  int32_t* n_hit) {
  const uint16_t* __restrict__ hit_slots = ws.hit_slots.data();
  int32_t* __restrict__ hits = ws.hits.data();
  int32_t* __restrict__ lru = io.lru;
  const int32_t c = io.c;
  int32_t ne = *n_evict, nh = *n_hit;
  for (; i < c; ++i) {
    const int32_t s = lru[i];
    if (static_cast<uint32_t>(s) >= static_cast<uint32_t>(c)) continue;
    const int32_t hit = (hit_slots[s >> 4] >> (s & 15)) & 1;
    hits[nh] = s;
    lru[ne] = s;  // ne <= i: never overwrites an entry not yet read
    nh += hit;
    ne += 1 - hit;
  }
  *n_evict = ne;
  *n_hit = nh;
}

// Walk the LRU order from entry i (oldest first): a resident token at or past the stable prefix
// is dropped (it may be rewritten by speculative decoding); a resident token in this step's set
// is a hit: it keeps its slot and is set aside in LRU order; every other slot is evictable,
// compacted in place at the front of `lru` in LRU order. Out-of-range slot entries (corrupt
// state) are skipped, as upstream does. Then each hit's slot is recorded by the rank of its
// token (slot_of_rank[rank(token)] = slot), in LRU order, so for a token held twice in corrupt
// state the later slot wins, as upstream's token_pos overwrite does.
//
// Branch-free on purpose: about 40% of the slots hit in no predictable pattern, and a branch on
// the hit mispredicts often enough to cost more than the rest of the loop. The rank is computed
// in a second loop over the hits only (~40% of the slots), whose tokens the walk lists.
template <typename W>
KVPD_INLINE void walk_scalar(const RowIO& io, Workspace& ws, int32_t stable, int32_t i,
                             int32_t* n_evict, int32_t* n_hit) {
  const W* __restrict__ mark = ws.bits<W>();
  int32_t* __restrict__ hits = ws.hits.data();
  uint32_t* __restrict__ hit_tokens = ws.hit_tokens.data();
  int32_t* __restrict__ lru = io.lru;
  int32_t* __restrict__ stt = io.slot_to_token;
  const uint32_t umax = static_cast<uint32_t>(io.max_token);
  const uint32_t ucap = static_cast<uint32_t>(io.c);
  const uint32_t ustable = static_cast<uint32_t>(stable);  // stable in [0, max_token]
  const int32_t c = io.c;
  const int32_t nh0 = *n_hit;
  int32_t ne = *n_evict, nh = nh0;
  for (; i < c; ++i) {
    const int32_t s = lru[i];
    if (static_cast<uint32_t>(s) >= ucap) continue;  // corrupt state only: predictable
    const uint32_t t = static_cast<uint32_t>(stt[s]);
    if (t < umax && t >= ustable) stt[s] = -1;  // rare: one token per row and step
    const uint32_t valid = static_cast<uint32_t>(t < ustable);  // ustable <= umax
    const uint32_t ti = t & (0u - valid);                      // 0 when not valid
    const uint32_t hit =
        valid & static_cast<uint32_t>((mark[ti >> kWordShift<W>] >> (ti & kBitMask<W>)) & 1);
    hit_tokens[nh] = ti;
    hits[nh] = s;
    lru[ne] = s;  // ne <= i: never overwrites an entry not yet read
    nh += static_cast<int32_t>(hit);
    ne += static_cast<int32_t>(hit ^ 1);
  }
  const uint32_t* __restrict__ rank_base = ws.rank_base.data();
  int32_t* __restrict__ sor = ws.slot_of_rank.data();
  for (int32_t j = nh0; j < nh; ++j) sor[rank_of(mark, rank_base, hit_tokens[j])] = hits[j];
  *n_evict = ne;
  *n_hit = nh;
}

// walk_scalar's result with less work per slot when every LRU entry is a slot index (always,
// on state this planner writes): one pass in slot order (vectorised by the compiler) drops the
// tokens at or past the stable prefix and checks the entries and tokens; then the walk needs
// neither the range checks nor the drop (about a fifth of its work per slot). Corrupt entries
// or tokens: walk_scalar from the start (the drop it repeats changes nothing).
template <typename W>
KVPD_INLINE void walk_checked(const RowIO& io, Workspace& ws, int32_t stable, int32_t* n_evict,
                              int32_t* n_hit) {
  int32_t* __restrict__ stt = io.slot_to_token;
  int32_t* __restrict__ lru = io.lru;
  const uint32_t umax = static_cast<uint32_t>(io.max_token);
  const uint32_t ustable = static_cast<uint32_t>(stable);  // stable in [0, max_token]
  const int32_t c = io.c;
  const uint32_t ucap = static_cast<uint32_t>(c);
  // After the drop a slot holds -1 or a token below the stable prefix, unless the state is
  // corrupt (a negative token other than -1, or one past max_token): then `bad` too.
  // Plain unsigned arithmetic (no &&), so that the compiler vectorises the loop.
  const uint32_t span = umax - ustable;  // t in [stable, max_token) <=> t - stable < span
  uint32_t bad = 0;
  for (int32_t s = 0; s < c; ++s) {
    const uint32_t t = static_cast<uint32_t>(stt[s]);
    const uint32_t kept = t | (0u - static_cast<uint32_t>(t - ustable < span));
    stt[s] = static_cast<int32_t>(kept);
    bad |= static_cast<uint32_t>(static_cast<uint32_t>(lru[s]) >= ucap);
    bad |= static_cast<uint32_t>(kept + 1u > ustable);  // kept >= stable, -1 wraps to 0
  }
  KVPD_PHASE(5)
  if (bad) {
    walk_scalar<W>(io, ws, stable, 0, n_evict, n_hit);
    return;
  }
  const W* __restrict__ mark = ws.bits<W>();
  int32_t* __restrict__ hits = ws.hits.data();
  // 64-bit cursors: no sign extension per store.
  int64_t nh = 0;
  auto step = [&](int64_t i) KVPD_LAMBDA_INLINE {
    const int32_t s = lru[i];
    const int64_t t = stt[s];  // -1 (empty: word -1 is the guard, zero) or below stable
    hits[nh] = s;
    lru[i - nh] = s;  // i - nh <= i: never overwrites an entry not yet read
    nh = add_bit(nh, mark[t >> kWordShift<W>], static_cast<W>(t));  // a hit (BT: b mod bits)
  };
  int64_t i = 0;
  if (io.next_stt != nullptr) {
    // A layer's rows (64 x 56 KiB of state, top-k and outputs here) do not fit in L2, and this
    // loop is the longest of the row: meanwhile fetch into L2 the next row's slot_to_token and
    // LRU order (a line of each per 16 slots), and its top-k and outputs (a line of each per 32
    // slots, so the first c/2 positions), so that its passes find them there (measured:
    // benchmarks/ascend_planner_phases.py).
    const char* ns = reinterpret_cast<const char*>(io.next_stt);
    const char* nl = reinterpret_cast<const char*>(io.next_lru);
    const char* nt = reinterpret_cast<const char*>(io.next_topk);
    const char* nc = reinterpret_cast<const char*>(io.next_cur);
    const char* nmt = reinterpret_cast<const char*>(io.next_mt);
    const char* nms = reinterpret_cast<const char*>(io.next_ms);
    const int64_t topk_bytes = int64_t{io.k} * 4;
    for (; i + 16 <= c; i += 16) {
      __builtin_prefetch(ns + i * 4, 0, 2);
      __builtin_prefetch(nl + i * 4, 1, 2);
      if ((i & 31) == 0 && i * 2 < topk_bytes) {
        __builtin_prefetch(nt + i * 2, 0, 2);
        __builtin_prefetch(nc + i * 2, 1, 2);
        __builtin_prefetch(nmt + i * 2, 1, 2);
        __builtin_prefetch(nms + i * 2, 1, 2);
      }
      for (int64_t j = i; j < i + 16; ++j) step(j);
    }
  }
  for (; i < c; ++i) step(i);
  KVPD_PHASE(6)
  const uint32_t* __restrict__ rank_base = ws.rank_base.data();
  int32_t* __restrict__ sor = ws.slot_of_rank.data();
  // A hit's token is read again from slot_to_token (which the walk has just read) rather than
  // stored by the walk: one store less per slot and 7 KiB less of the row's working set.
  for (int64_t j = 0; j < nh; ++j) {
    const int32_t s = hits[j];
    sor[rank_of(mark, rank_base, static_cast<uint32_t>(stt[s]))] = s;
  }
  *n_evict = static_cast<int32_t>(c - nh);
  *n_hit = static_cast<int32_t>(nh);
}

// Resolve top-k positions from p: a hit takes its slot; a token's first miss takes the oldest
// evictable slot and later duplicates share it. Misses beyond the evictable slots (only when
// capacity < topk, which the configuration forbids) stay unplaced (-1).
template <typename W>
KVPD_INLINE void resolve_scalar(const RowIO& io, Workspace& ws, int32_t p, int32_t end,
                                int32_t n_evict, int32_t* n_miss) {
  // Locals with __restrict__: stores through int32 pointers could otherwise alias io's int32
  // fields in the compiler's eyes, and it would reload them every position.
  const W* __restrict__ mark = ws.bits<W>();
  const uint32_t* __restrict__ rank_base = ws.rank_base.data();
  int32_t* __restrict__ sor = ws.slot_of_rank.data();
  const int32_t* __restrict__ topk = io.topk;
  const int32_t* __restrict__ lru = io.lru;
  int32_t* __restrict__ stt = io.slot_to_token;
  int32_t* __restrict__ cur = io.current_slots;
  int32_t* __restrict__ mt = io.miss_tokens;
  int32_t* __restrict__ ms = io.miss_slots;
  const uint32_t umax = static_cast<uint32_t>(io.max_token);
  int32_t m = *n_miss;
  for (; p < end; ++p) {
    const int32_t t = topk[p];
    if (static_cast<uint32_t>(t) >= umax) {
      cur[p] = -1;
      continue;
    }
    const uint32_t r = rank_of(mark, rank_base, static_cast<uint32_t>(t));
    int32_t s = sor[r];
    if (s < 0 && m < n_evict) {
      s = lru[m];
      sor[r] = s;
      stt[s] = t;
      mt[m] = t;
      ms[m] = s;
      ++m;
    }
    cur[p] = s;
  }
  *n_miss = m;
}

// resolve_scalar's result when no token repeats among the row's valid positions (begin_ranks
// knows: distinct == valid), in two loops. The first, over all k positions, has no branch on
// the outcome: about one position in ten misses, in no pattern a predictor learns, and each
// misprediction costs more than the whole of a hit's work (measured: ~6,500 cycles a row). A
// position stores the slot its rank holds (-1 for a miss) and its index at the miss cursor,
// which advances on a miss; padding reads rank 0 and resolves to -1. The second loop, over the
// misses only, gives them the oldest evictable slots in order. With no repeats no token misses
// twice, so slot_of_rank needs no update for later positions (a repeated token must share its
// first miss's slot: that is resolve_scalar's work).
template <typename W>
KVPD_INLINE void resolve_distinct(const RowIO& io, Workspace& ws, bool padded, int32_t n_evict,
                                  int32_t* n_miss) {
  const W* __restrict__ mark = ws.bits<W>();
  const uint32_t* __restrict__ rank_base = ws.rank_base.data();
  const int32_t* __restrict__ sor = ws.slot_of_rank.data();
  const int32_t* __restrict__ topk = io.topk;
  int32_t* __restrict__ cur = io.current_slots;
  int32_t* __restrict__ miss_pos = ws.miss_pos.data();
  const uint32_t umax = static_cast<uint32_t>(io.max_token);
  const int64_t k = io.k;
  int64_t n = 0;  // 64-bit: no sign extension per store
  if (padded) {
    for (int64_t p = 0; p < k; ++p) {
      const uint32_t t = static_cast<uint32_t>(topk[p]);
      const uint32_t valid = static_cast<uint32_t>(t < umax);
      const uint32_t r = rank_of(mark, rank_base, t & (0u - valid));  // padding: rank of token 0
      const int32_t s = sor[r] | static_cast<int32_t>(valid - 1);     // padding: -1
      cur[p] = s;
      miss_pos[n] = static_cast<int32_t>(p);  // n <= p < k
      n += valid & (static_cast<uint32_t>(s) >> 31);
    }
  } else {  // every position valid (the usual row): a third fewer operations per position
    for (int64_t p = 0; p < k; ++p) {
      const int32_t s = sor[rank_of(mark, rank_base, static_cast<uint32_t>(topk[p]))];
      cur[p] = s;
      miss_pos[n] = static_cast<int32_t>(p);
      n += static_cast<uint32_t>(s) >> 31;
    }
  }
  const int32_t m = static_cast<int32_t>(std::min<int64_t>(n, n_evict));
  const int32_t* __restrict__ lru = io.lru;
  int32_t* __restrict__ stt = io.slot_to_token;
  int32_t* __restrict__ mt = io.miss_tokens;
  int32_t* __restrict__ ms = io.miss_slots;
  for (int32_t j = 0; j < m; ++j) {
    const int32_t p = miss_pos[j], s = lru[j], t = topk[p];
    cur[p] = s;
    stt[s] = t;
    mt[j] = t;
    ms[j] = s;
  }
  *n_miss = m;
}

// Pad the miss lists and write the new LRU order (unused evictables in old order, filled
// misses, hits in old order).
KVPD_INLINE void finish_lists(const RowIO& io, const Workspace& ws, int32_t m, int32_t n_evict,
                              int32_t n_hit) {
  std::fill(io.miss_tokens + m, io.miss_tokens + io.k, -1);
  std::fill(io.miss_slots + m, io.miss_slots + io.k, -1);
  *io.miss_count = m;
  std::memmove(io.lru, io.lru + m, sizeof(int32_t) * static_cast<size_t>(n_evict - m));
  std::memcpy(io.lru + (n_evict - m), io.miss_slots, sizeof(int32_t) * static_cast<size_t>(m));
  std::memcpy(io.lru + n_evict, ws.hits.data(), sizeof(int32_t) * static_cast<size_t>(n_hit));
}

// finish_lists, and leave the bitmap all-zero for the next row.
template <typename W>
KVPD_INLINE void finish_row(const RowIO& io, Workspace& ws, int32_t m, int32_t n_evict,
                            int32_t n_hit, uint32_t last_word) {
  finish_lists(io, ws, m, n_evict, n_hit);
  std::memset(ws.bits<W>(), 0, sizeof(W) * (static_cast<size_t>(last_word) + 1));
}

// One row on the 64-bit bitmap: mark, rank prefix (`prefix(ws, last_word)`, scalar or an
// ISA's), walk, resolve, finish. Rows with a repeated token take resolve_scalar, which shares
// the first miss's slot.
template <typename Prefix>
KVPD_INLINE void plan_row_with(const RowIO& io, Workspace& ws, Prefix prefix) {
  using W = uint64_t;
  uint32_t n_valid = 0;
  RowMarks marks = mark_row<W>(io, ws, &n_valid);
  begin_ranks(ws, &marks, n_valid, prefix(ws, marks.last_word));
  int32_t ne = 0, nh = 0, m = 0;
  walk_checked<W>(io, ws, marks.stable, &ne, &nh);
  if (marks.duplicates) {
    resolve_scalar<W>(io, ws, 0, io.k, ne, &m);
  } else {
    resolve_distinct<W>(io, ws, n_valid < static_cast<uint32_t>(io.k), ne, &m);
  }
  finish_row<W>(io, ws, m, ne, nh, marks.last_word);
}

KVPD_INLINE void plan_row_generic(const RowIO& io, Workspace& ws) {
  plan_row_with(io, ws, [](Workspace& w, uint32_t last) KVPD_LAMBDA_INLINE {
    return rank_prefix_scalar<uint64_t>(w, last);
  });
}

}  // namespace kvpd_ascend
