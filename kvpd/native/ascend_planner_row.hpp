// SPDX-License-Identifier: Apache-2.0
// One row of lru_resident_compact: the inputs, the scratch and the phases that every ISA variant
// shares, and the scalar phases of the AVX-512 paths (32-bit bitmap words) for their tails and
// rare cases. The portable paths' row planner is ascend_planner_row64.hpp. The functions are
// always_inline so that each variant (compiled with its own target attribute) gets its own copy
// optimised for its instruction set.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
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

// One layer's arrays in the manager's layout (row-major, one row per request): `row(r, next)` is
// row r's RowIO, with row `next` (negative: none) fetched ahead while r is planned.
struct LayerIO {
  const int32_t* topk;
  const int64_t* req;
  const int32_t* stable;
  int64_t* last;
  int32_t *stt, *lru, *cur, *mt, *ms, *mc;
  int32_t k, c, max_token;

  RowIO row(int64_t r, int64_t next) const {
    RowIO io{topk + r * k, req[r], stable[r], last + r, stt + r * c, lru + r * c,
             cur + r * k,  mt + r * k, ms + r * k, mc + r, k, c, max_token};
    if (next >= 0) {
      io.next_stt = stt + next * c;
      io.next_lru = lru + next * c;
      io.next_topk = topk + next * k;
      io.next_cur = cur + next * k;
      io.next_mt = mt + next * k;
      io.next_ms = ms + next * k;
    }
    return io;
  }
};

// Per-thread scratch. `bits<W>()` is a bitmap over token ids in words of type W (all-zero between
// rows); `rank_base` holds, per word, the count of marked tokens on one side of it, so that a
// marked token's rank among the row's distinct top-k tokens is that count plus a popcount in its
// word (from the bottom on the AVX-512 paths, AscRanks32; from the top on the portable paths,
// DescRanks), and `slot_of_rank` maps a rank to its slot (-1: not resident). 16 KiB of bitmap
// for 128k tokens stays in L1, where upstream's two max_token-sized int32 tables (1 MiB) do not.
// Buffers carry 16 entries of slack so SIMD code may store whole vectors.
//
// Two bitmaps of the same tokens, each used by its own row planners: 64-bit words on the
// portable paths (baseline, AVX2, NEON, SVE): half the words of 32-bit ones, so the rank prefix
// runs half as many steps (1,800 instead of 2,800 ticks a row on Zen 4) and the part of
// rank_base a row uses takes half the L1; 32-bit words on the AVX-512 paths, whose gathers read
// 32-bit lanes.
//
// A bitmap starts one word into its vector: that word stays zero, so an empty slot's token
// (-1, shifted right arithmetically to word -1) tests as "not in the set" with no test of its own.
//
// Slots are held in 16 bits (slot_of_rank16, hits16) on the portable paths when the hot buffer
// has at most kMaxSlots16 slots (always, in the configurations the guides give: 4096), else in
// 32 bits as on the AVX-512 paths: the tables a row reads at random then take 4 KiB less of L1
// and the hit list half the lines, with no instruction more (a 16-bit load sign-extends as a
// 32-bit one loads). Counted with benchmarks/ascend_planner_cachesim.py: 19% fewer L1d misses a
// row with a 32 KiB L1 (Zen 3 and 4), 16% fewer with 48 KiB.
struct Workspace {
  std::vector<uint32_t> mark_words, rank_base;
  std::vector<uint64_t> mark_words64;
  std::vector<int32_t> slot_of_rank, hits;
  std::vector<int16_t> slot_of_rank16, hits16;
  std::vector<uint32_t> hit_tokens;  // walk_scalar64: the tokens of `hits`
  std::vector<uint16_t> hit_slots;  // a bit per slot, 16 per entry
  std::vector<int32_t> miss_pos;     // resolve_distinct64: positions that missed

  template <typename W>
  W* bits();
  // slot_of_rank and hits in slots of type S (int32_t or int16_t).
  template <typename S>
  S* slots_by_rank() {
    return pick<S>(slot_of_rank, slot_of_rank16);
  }
  template <typename S>
  S* hit_list() {
    return pick<S>(hits, hits16);
  }

  void fit(int64_t max_token, int64_t topk, int64_t capacity) {
    const size_t words = static_cast<size_t>(max_token >> 5) + 2;  // rank_base: either width
    if (rank_base.size() < words) {
      mark_words.assign(words + 1, 0);
      mark_words64.assign(static_cast<size_t>(max_token >> 6) + 3, 0);
      rank_base.assign(words, 0);
    }
    if (slot_of_rank.size() < static_cast<size_t>(topk) + 16) {
      slot_of_rank.resize(topk + 16);
      slot_of_rank16.resize(topk + 16);
      miss_pos.resize(topk + 16);
    }
    if (hits.size() < static_cast<size_t>(capacity) + 16) {
      hits.resize(capacity + 16);
      hits16.resize(capacity + 16);
      hit_tokens.resize(capacity + 16);
      hit_slots.resize(static_cast<size_t>(capacity / 16) + 2);  // +1: 32-bit gather reads
    }
  }

 private:
  template <typename S>
  static S* pick(std::vector<int32_t>& wide, std::vector<int16_t>& narrow) {
    static_assert(std::is_same_v<S, int32_t> || std::is_same_v<S, int16_t>);
    if constexpr (std::is_same_v<S, int16_t>) {
      return narrow.data();
    } else {
      return wide.data();
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

// The most slots a hot buffer may have for its slots to be held in 16 bits (slot indices up to
// 32767, and -1 for "none").
constexpr int32_t kMaxSlots16 = 32768;

// log2 of a bitmap word's bits: token t is bit t % bits of word t >> kWordShift<W>.
template <typename W>
constexpr uint32_t kWordShift = sizeof(W) == 8 ? 6 : 5;
template <typename W>
constexpr uint32_t kBitMask = (1u << kWordShift<W>) - 1;

KVPD_INLINE uint32_t popcount(uint32_t w) { return static_cast<uint32_t>(__builtin_popcount(w)); }
KVPD_INLINE uint32_t popcount(uint64_t w) {
  return static_cast<uint32_t>(__builtin_popcountll(w));
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

// Reset the row's state when it belongs to another request than the one it last planned.
KVPD_INLINE void reset_on_new_request(const RowIO& io) {
  if (*io.last_req_id != io.req_id) {
    std::fill(io.slot_to_token, io.slot_to_token + io.c, -1);
    for (int32_t s = 0; s < io.c; ++s) io.lru[s] = s;
    *io.last_req_id = io.req_id;
  }
}

// The start of the ranks: whether a token repeats, and the slot of every rank cleared, from 0
// (the AVX-512 paths' first) to `distinct` (the portable paths' last, DescRanks), in slots of
// type S.
template <typename S = int32_t>
KVPD_INLINE void begin_ranks(Workspace& ws, RowMarks* marks, uint32_t n_valid, uint32_t distinct) {
  marks->duplicates = distinct < n_valid;
  S* sor = ws.slots_by_rank<S>();
  std::fill(sor, sor + distinct + 1, S{-1});
}

// The AVX-512 path splits the LRU walk (walk_checked64 on the portable paths) in two passes,
// because its gathers of slot_to_token in LRU order cost more than reading it in sequence: pass
// A, in slot order from slot s, drops a resident token at or past the stable prefix and gives
// each hit its slot (slot_of_rank[rank(token)] = slot), noting hit slots in `hit_slots`; pass B
// splits the LRU order from the bitmap. The state this planner produces never holds a token in two slots, so
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
    // Branch-free from here (see walk_checked64).
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

// Ranks from the bottom on the AVX-512 paths' 32-bit bitmap: rank_base[w] counts the marked
// tokens in words before w, and slot_of_rank maps a rank to its slot. resolve_scalar looks
// slots up through this or through the portable paths' DescRanks (ascend_planner_row64.hpp).
struct AscRanks32 {
  const uint32_t* __restrict__ mark;
  const uint32_t* __restrict__ rank_base;
  int32_t* __restrict__ sor;

  explicit AscRanks32(Workspace& ws)
      : mark(ws.bits<uint32_t>()), rank_base(ws.rank_base.data()), sor(ws.slot_of_rank.data()) {}
  KVPD_INLINE int32_t& slot(uint32_t t) const { return sor[rank_of(mark, rank_base, t)]; }
};

// Resolve top-k positions from p: a hit takes its slot; a token's first miss takes the oldest
// evictable slot and later duplicates share it. Misses beyond the evictable slots (only when
// capacity < topk, which the configuration forbids) stay unplaced (-1).
template <typename Ranks>
KVPD_INLINE void resolve_scalar(const RowIO& io, const Ranks& ranks, int32_t p, int32_t end,
                                int32_t n_evict, int32_t* n_miss) {
  // Locals with __restrict__: stores through int32 pointers could otherwise alias io's int32
  // fields in the compiler's eyes, and it would reload them every position.
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
    auto& slot = ranks.slot(static_cast<uint32_t>(t));
    int32_t s = slot;
    if (s < 0 && m < n_evict) {
      s = lru[m];
      slot = static_cast<std::remove_reference_t<decltype(slot)>>(s);  // a slot index: fits
      stt[s] = t;
      mt[m] = t;
      ms[m] = s;
      ++m;
    }
    cur[p] = s;
  }
  *n_miss = m;
}

// Pad the miss lists and move the unused evictable slots (in old order) and the filled misses'
// slots to the front of the new LRU order; the hits follow them.
KVPD_INLINE void finish_misses(const RowIO& io, int32_t m, int32_t n_evict) {
  std::fill(io.miss_tokens + m, io.miss_tokens + io.k, -1);
  std::fill(io.miss_slots + m, io.miss_slots + io.k, -1);
  *io.miss_count = m;
  std::memmove(io.lru, io.lru + m, sizeof(int32_t) * static_cast<size_t>(n_evict - m));
  std::memcpy(io.lru + (n_evict - m), io.miss_slots, sizeof(int32_t) * static_cast<size_t>(m));
}

// finish_misses, the hits (listed in old order from hits[0]) after them, and the bitmap left
// all-zero for the next row: the AVX-512 paths' end of a row.
KVPD_INLINE void finish_row32(const RowIO& io, Workspace& ws, int32_t m, int32_t n_evict,
                              int32_t n_hit, uint32_t last_word) {
  finish_misses(io, m, n_evict);
  std::memcpy(io.lru + n_evict, ws.hits.data(), sizeof(int32_t) * static_cast<size_t>(n_hit));
  std::memset(ws.bits<uint32_t>(), 0, sizeof(uint32_t) * (static_cast<size_t>(last_word) + 1));
}

}  // namespace kvpd_ascend
