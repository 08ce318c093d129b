// SPDX-License-Identifier: Apache-2.0
// The portable row planner: the baseline, AVX2, NEON and SVE paths (plan_row_with), one row of
// lru_resident_compact on a 64-bit top-k bitmap. Faster than upstream's by its work per slot and
// per position rather than by vector width (Kunpeng hosts have no AVX-512); each loop below says
// what it saves. The AVX-512 paths keep the 32-bit bitmap of ascend_planner_row.hpp.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "ascend_planner_row.hpp"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace kvpd_ascend {

// The phases of plan_row_with, for the instrumented build of benchmarks/ascend_planner_phases.cpp
// (KVPD_PHASE(p) marks the end of phase p).
enum RowPhase : int {
  kPhaseMark,      // mark the top-k bitmap
  kPhaseRanks,     // rank suffix, slot_of_rank cleared
  kPhaseSlots,     // slot-order pass: drop tokens past the stable prefix, check the state
  kPhaseWalk,      // LRU-order split into evictable slots and hits
  kPhaseHitRanks,  // each hit's slot recorded by its token's rank
  kPhaseResolve,   // top-k positions to slots, misses given the oldest evictable slots
  kPhaseFinish,    // miss lists padded, the new LRU order, the bitmap cleared
  kRowPhases
};

// Ranks counted from the top. suffix[w] holds the marked tokens in the words after w, so a
// marked token t's rank among the row's distinct tokens, highest first and from 1, is
// suffix[w] + popcount(mark[w] >> t % 64): the word's marked bits at and above t's own (t's own
// bit is always set, which is why the count starts at 1). A shift and a popcount, where a rank
// from the bottom needs a mask of the bits below t (two or three operations more per lookup,
// about 4,000 lookups a row). The slot of a rank (in slots of type S: Workspace) is indexed by
// this rank, so `sor1[0]` is never a member's: padding may read it.
template <typename S>
struct DescRanks {
  const uint64_t* __restrict__ mark;
  const uint32_t* __restrict__ suffix;
  S* __restrict__ sor1;

  explicit DescRanks(Workspace& ws)
      : mark(ws.bits<uint64_t>()), suffix(ws.rank_base.data()), sor1(ws.slots_by_rank<S>()) {}
  KVPD_INLINE uint32_t index(uint32_t t) const {
    return suffix[t >> 6] + popcount(static_cast<uint64_t>(mark[t >> 6] >> (t & 63)));
  }
  KVPD_INLINE S& slot(uint32_t t) const { return sor1[index(t)]; }
};

// n - bit b (mod 64) of w: BT and SBB on x86, where a shift by a variable count is two or three
// micro-ops on Intel cores without BMI2 (the baseline path) and BT's result as a value would
// take a SETC and a zero extension first. Elsewhere the compiler's shift is as good.
KVPD_INLINE int64_t sub_bit(int64_t n, uint64_t w, uint64_t b) {
#if defined(__x86_64__)
  asm("btq %2, %1\n\tsbbq $0, %0" : "+r"(n) : "r"(w), "r"(b) : "cc");
  return n;
#else
  return n - static_cast<int64_t>((w >> (b & 63)) & 1);
#endif
}

// Reset on a new request and mark this step's top-k set. The count and the highest of the
// valid tokens come from a loop of their own, which the compiler vectorises, so that the
// marking loop is a load, a compare and an OR into memory per position.
KVPD_INLINE RowMarks mark_row64(const RowIO& io, Workspace& ws, uint32_t* n_valid) {
  reset_on_new_request(io);
  uint64_t* __restrict__ mark = ws.bits<uint64_t>();
  const int32_t* __restrict__ topk = io.topk;
  const int32_t k = io.k;
  const uint32_t umax = static_cast<uint32_t>(io.max_token);
  uint32_t highest = 0, valid = 0;
  for (int32_t p = 0; p < k; ++p) {
    const uint32_t t = static_cast<uint32_t>(topk[p]);
    const uint32_t v = static_cast<uint32_t>(t < umax);
    valid += v;
    highest = std::max(highest, t & (0u - v));
  }
  // Unrolled 8: the loop's count, compare and branch were 3 of its 10 instructions a position.
  // A 64-bit token lets the word index address the bitmap past its guard word with no add.
  const uint64_t umax64 = umax;
#pragma GCC unroll 8
  for (int32_t p = 0; p < k; ++p) {
    const uint64_t t = static_cast<uint32_t>(topk[p]);
    if (t < umax64) mark[t >> 6] |= uint64_t{1} << (t & 63);  // padding is rare: predicted
  }
  *n_valid = valid;
  return {std::min(std::max(io.stable_in, 0), io.max_token), highest >> 6, false};
}

// suffix[w] = marked tokens in words after w, for w <= last_word; returns the total.
KVPD_INLINE uint32_t rank_suffix_scalar(Workspace& ws, uint32_t last_word) {
  const uint64_t* __restrict__ mark = ws.bits<uint64_t>();
  uint32_t* __restrict__ suffix = ws.rank_base.data();
  uint32_t above = 0;
  // Unrolled 4: built for AVX2 the plain loop took 1,980 ticks a row or 1,400, by where the
  // linker placed it; unrolled it takes 1,400 in both builds measured.
#pragma GCC unroll 4
  for (int64_t w = last_word; w >= 0; --w) {
    suffix[w] = above;
    above += popcount(mark[w]);
  }
  return above;
}

// Walk the LRU order from entry i (oldest first), checking everything (corrupt state): a
// resident token at or past the stable prefix is dropped (it may be rewritten by speculative
// decoding); a resident token in this step's set is a hit and keeps its slot; every other slot
// is evictable, compacted in place at the front of `lru` in LRU order; out-of-range entries are
// skipped, as upstream does. Hits are stored downward from hits[c] (the layout walk_checked64
// writes). Then each hit's slot is recorded by its token's rank in LRU order, so for a token
// held twice the later slot wins, as upstream's token_pos overwrite does.
template <typename S>
KVPD_INLINE void walk_scalar64(const RowIO& io, Workspace& ws, int32_t stable, int32_t* n_evict,
                               int32_t* n_hit) {
  const DescRanks<S> ranks(ws);
  S* __restrict__ hend = ws.hit_list<S>() + io.c;
  uint32_t* __restrict__ hit_tokens = ws.hit_tokens.data();
  int32_t* __restrict__ lru = io.lru;
  int32_t* __restrict__ stt = io.slot_to_token;
  const uint32_t umax = static_cast<uint32_t>(io.max_token);
  const uint32_t ucap = static_cast<uint32_t>(io.c);
  const uint32_t ustable = static_cast<uint32_t>(stable);  // stable in [0, max_token]
  int32_t ne = 0, nh = 0;
  for (int32_t i = 0; i < io.c; ++i) {
    const int32_t s = lru[i];
    if (static_cast<uint32_t>(s) >= ucap) continue;
    const uint32_t t = static_cast<uint32_t>(stt[s]);
    if (t < umax && t >= ustable) stt[s] = -1;
    const uint32_t valid = static_cast<uint32_t>(t < ustable);
    const uint32_t ti = t & (0u - valid);
    const uint32_t hit = valid & static_cast<uint32_t>((ranks.mark[ti >> 6] >> (ti & 63)) & 1);
    hit_tokens[nh] = ti;
    hend[-nh] = static_cast<S>(s);
    lru[ne] = s;  // ne <= i: never overwrites an entry not yet read
    nh += static_cast<int32_t>(hit);
    ne += static_cast<int32_t>(hit ^ 1);
  }
  for (int32_t j = 0; j < nh; ++j) ranks.slot(hit_tokens[j]) = hend[-j];
  *n_evict = ne;
  *n_hit = nh;
}

// The next row's state, top-k and outputs fetched into L2 while this row's LRU walk runs (64
// rows x 56 KiB of a layer do not fit in L2), a line of its slot_to_token and LRU order per 16
// slots and of its top-k and outputs per 32 slots (their first c/2 positions).
KVPD_INLINE void fetch_next_row(const RowIO& io, int64_t i) {
  __builtin_prefetch(reinterpret_cast<const char*>(io.next_stt) + i * 4, 0, 2);
  __builtin_prefetch(reinterpret_cast<const char*>(io.next_lru) + i * 4, 1, 2);
  if ((i & 31) == 0 && i < int64_t{io.k} * 2) {
    __builtin_prefetch(reinterpret_cast<const char*>(io.next_topk) + i * 2, 0, 2);
    __builtin_prefetch(reinterpret_cast<const char*>(io.next_cur) + i * 2, 1, 2);
    __builtin_prefetch(reinterpret_cast<const char*>(io.next_mt) + i * 2, 1, 2);
    __builtin_prefetch(reinterpret_cast<const char*>(io.next_ms) + i * 2, 1, 2);
  }
}

// walk_scalar64's result with less work per slot when every LRU entry is a slot index and every
// token is -1 or in range (always, on state this planner writes). A slot-order pass checks that
// and drops the tokens at or past the stable prefix; then the walk needs neither range checks
// nor the drop. The walk keeps one cursor, the negated hit count: a slot is stored at
// hits[c - hits so far] and at lru[i - hits so far] (the evictable slots, compacted in place),
// both addressed through it, and a hit decrements it (BT + SBB on x86): 10 instructions a slot,
// where two cursors took 15. Branch-free on purpose: about 40% of
// the slots hit, in no pattern a predictor learns.
template <typename S>
KVPD_INLINE void walk_checked64(const RowIO& io, Workspace& ws, int32_t stable, int32_t* n_evict,
                                int32_t* n_hit) {
  int32_t* __restrict__ stt = io.slot_to_token;
  int32_t* __restrict__ lru = io.lru;
  const uint32_t ustable = static_cast<uint32_t>(stable);  // stable in [0, max_token]
  const int32_t c = io.c;
  const uint32_t ucap = static_cast<uint32_t>(c);
  // The state is sound when every LRU entry is below c and every token is -1 or below
  // max_token ((t + 1) <= max_token, unsigned); a token in [stable, max_token) is to be dropped
  // (t - stable < max_token - stable, unsigned). Three unsigned maxima and minima, which the
  // compiler vectorises with no store (a drop is rare: at most the tokens a speculative step
  // rewrote); the drop, when there is one, is a loop of its own.
  const uint32_t span = static_cast<uint32_t>(io.max_token) - ustable;
  uint32_t top_token = 0, top_slot = 0, past_stable = UINT32_MAX;
  for (int32_t s = 0; s < c; ++s) {
    const uint32_t t = static_cast<uint32_t>(stt[s]);
    top_token = std::max(top_token, t + 1u);
    top_slot = std::max(top_slot, static_cast<uint32_t>(lru[s]));
    past_stable = std::min(past_stable, t - ustable);
  }
  if (past_stable < span) {
    for (int32_t s = 0; s < c; ++s) {
      const uint32_t t = static_cast<uint32_t>(stt[s]);
      stt[s] = static_cast<int32_t>(t | (0u - static_cast<uint32_t>(t - ustable < span)));
    }
  }
  const bool bad = top_token > static_cast<uint32_t>(io.max_token) || top_slot >= ucap;
  KVPD_PHASE(kPhaseSlots)
  if (bad) {
    walk_scalar64<S>(io, ws, stable, n_evict, n_hit);
    KVPD_PHASE(kPhaseWalk)
    return;
  }
  const uint64_t* __restrict__ mark = ws.bits<uint64_t>();
  S* __restrict__ hend = ws.hit_list<S>() + c;
  int64_t neg = 0;
  // The LRU entry block[j]: its slot stored at hend[neg] and at block[j + neg] (j + neg <= j:
  // an entry already read); a hit decrements neg.
  auto step = [&](int32_t* __restrict__ block, int64_t j) KVPD_LAMBDA_INLINE {
    const uint32_t s = static_cast<uint32_t>(block[j]);  // a slot index: checked above
    const int64_t t = stt[s];  // -1 (empty: word -1 is the guard, zero) or below stable
    hend[neg] = static_cast<S>(s);
    block[j + neg] = static_cast<int32_t>(s);
    neg = sub_bit(neg, mark[t >> 6], static_cast<uint64_t>(t));
  };
  int64_t i = 0;
  const bool ahead = io.next_stt != nullptr;
  for (; i + 16 <= c; i += 16) {
    if (ahead) fetch_next_row(io, i);
#pragma GCC unroll 16
    for (int64_t j = 0; j < 16; ++j) step(lru + i, j);
  }
  for (; i < c; ++i) step(lru, i);
  KVPD_PHASE(kPhaseWalk)
  const DescRanks<S> ranks(ws);
  const int64_t nh = -neg;
  // A hit's token is read again from slot_to_token (which the walk has just read) rather than
  // stored by the walk: one store less per slot. Unrolled, as resolve's first pass: the loop's
  // own instructions were 3 of 12 a hit.
#pragma GCC unroll 8
  for (int64_t j = 0; j < nh; ++j) {
    const S s = hend[-j];
    ranks.slot(static_cast<uint32_t>(stt[s])) = s;
  }
  *n_evict = static_cast<int32_t>(c - nh);
  *n_hit = static_cast<int32_t>(nh);
}

// The top-k positions (from 64-position group p0) whose slot is negative: a 64-bit mask, bit j
// for position p0 + j, from the sign bits (MOVMSKPS on x86, four positions an instruction).
KVPD_INLINE uint64_t negative_slots(const int32_t* cur, int64_t p0) {
  uint64_t bits = 0;
#if defined(__SSE2__)
#pragma GCC unroll 16
  for (int j = 0; j < 16; ++j) {
    const __m128i four = _mm_loadu_si128(reinterpret_cast<const __m128i*>(cur + p0 + 4 * j));
    const __m128 v = _mm_castsi128_ps(four);
    bits |= static_cast<uint64_t>(static_cast<uint32_t>(_mm_movemask_ps(v))) << (4 * j);
  }
#else
  for (int j = 0; j < 64; ++j) {
    bits |= static_cast<uint64_t>(static_cast<uint32_t>(cur[p0 + j]) >> 31) << j;
  }
#endif
  return bits;
}

// Resolve every position when no token repeats among the row's valid positions (distinct ==
// valid), in two passes. The first, with no branch on the outcome, gives each position the slot
// its rank holds (-1: a miss; about one position in ten, in no pattern a predictor learns, and
// a misprediction costs more than a hit's whole work). The second finds the misses by the sign
// bits, 64 positions a mask, and gives them the oldest evictable slots in order: its loop
// mispredicts about once per 64 positions. Misses beyond the evictable slots (only when
// capacity < topk, which the configuration forbids) stay unplaced (-1). With no repeats no token
// misses twice, so slot_of_rank needs no update (a repeated token must share its first miss's
// slot: resolve_scalar's work). Padding reads the rank of token 0, a valid index, and resolves
// to -1; in a padded row the misses are listed by position in the first pass instead, since a
// sign bit does not tell them from padding.
template <typename S>
KVPD_INLINE void resolve_distinct64(const RowIO& io, Workspace& ws, bool padded, int32_t n_evict,
                                    int32_t* n_miss) {
  const DescRanks<S> ranks(ws);
  const int32_t* __restrict__ topk = io.topk;
  int32_t* __restrict__ cur = io.current_slots;
  const int64_t k = io.k;
  const int32_t* __restrict__ lru = io.lru;
  int32_t* __restrict__ stt = io.slot_to_token;
  int32_t* __restrict__ mt = io.miss_tokens;
  int32_t* __restrict__ ms = io.miss_slots;
  int32_t m = 0;
  auto place = [&](int64_t p) KVPD_LAMBDA_INLINE {
    const int32_t s = lru[m], t = topk[p];
    cur[p] = s;
    stt[s] = t;
    mt[m] = t;
    ms[m] = s;
    ++m;
  };
  if (padded) {
    int32_t* __restrict__ miss_pos = ws.miss_pos.data();
    const uint32_t umax = static_cast<uint32_t>(io.max_token);
    int64_t n = 0;  // 64-bit: no sign extension per store
    for (int64_t p = 0; p < k; ++p) {
      const uint32_t t = static_cast<uint32_t>(topk[p]);
      const uint32_t valid = static_cast<uint32_t>(t < umax);
      const int32_t s =
          ranks.sor1[ranks.index(t & (0u - valid))] | static_cast<int32_t>(valid - 1);
      cur[p] = s;
      miss_pos[n] = static_cast<int32_t>(p);  // n <= p < k
      n += valid & (static_cast<uint32_t>(s) >> 31);
    }
    const int64_t placed = std::min<int64_t>(n, n_evict);
    for (int64_t j = 0; j < placed; ++j) place(miss_pos[j]);
    *n_miss = m;
    return;
  }
#pragma GCC unroll 8
  for (int64_t p = 0; p < k; ++p) cur[p] = ranks.slot(static_cast<uint32_t>(topk[p]));
  int64_t p0 = 0;
  for (; p0 + 64 <= k; p0 += 64) {
    for (uint64_t bits = negative_slots(cur, p0); bits != 0 && m < n_evict; bits &= bits - 1) {
      place(p0 + __builtin_ctzll(bits));
    }
  }
  for (; p0 < k && m < n_evict; ++p0) {
    if (cur[p0] < 0) place(p0);
  }
  *n_miss = m;
}

// Pad the miss lists, write the new LRU order (unused evictables in old order, filled misses,
// hits in old order: walk_checked64 stored them downward from hits[c]) and leave the bitmap
// all-zero for the next row.
template <typename S>
KVPD_INLINE void finish_row64(const RowIO& io, Workspace& ws, int32_t m, int32_t n_evict,
                              int32_t n_hit, uint32_t last_word) {
  finish_misses(io, m, n_evict);
  const S* __restrict__ hend = ws.hit_list<S>() + io.c;
  int32_t* __restrict__ out = io.lru + n_evict;
  for (int32_t j = 0; j < n_hit; ++j) out[j] = hend[-j];
  std::memset(ws.bits<uint64_t>(), 0, sizeof(uint64_t) * (static_cast<size_t>(last_word) + 1));
}

// One row in slots of type S: mark, rank suffix (`suffix(ws, last_word)`, scalar or an ISA's),
// walk, resolve, finish. Rows with a repeated token take resolve_scalar, which shares the first
// miss's slot; kAllScalar sends every row there (what benchmarks/ascend_planner_phases.cpp
// measures a branch on each miss by).
template <typename S, bool kAllScalar, typename Suffix>
KVPD_INLINE void plan_row_slots(const RowIO& io, Workspace& ws, Suffix suffix) {
  uint32_t n_valid = 0;
  RowMarks marks = mark_row64(io, ws, &n_valid);
  KVPD_PHASE(kPhaseMark)
  begin_ranks<S>(ws, &marks, n_valid, suffix(ws, marks.last_word));
  KVPD_PHASE(kPhaseRanks)
  int32_t ne = 0, nh = 0, m = 0;
  walk_checked64<S>(io, ws, marks.stable, &ne, &nh);
  KVPD_PHASE(kPhaseHitRanks)
  if (kAllScalar || marks.duplicates) {
    resolve_scalar(io, DescRanks<S>(ws), 0, io.k, ne, &m);
  } else {
    resolve_distinct64<S>(io, ws, n_valid < static_cast<uint32_t>(io.k), ne, &m);
  }
  KVPD_PHASE(kPhaseResolve)
  finish_row64<S>(io, ws, m, ne, nh, marks.last_word);
  KVPD_PHASE(kPhaseFinish)
}

// One row, its slots held in 16 bits when the hot buffer allows it (Workspace).
template <bool kAllScalar = false, typename Suffix>
KVPD_INLINE void plan_row_with(const RowIO& io, Workspace& ws, Suffix suffix) {
  if (io.c <= kMaxSlots16) {
    plan_row_slots<int16_t, kAllScalar>(io, ws, suffix);
  } else {
    plan_row_slots<int32_t, kAllScalar>(io, ws, suffix);
  }
}

template <bool kAllScalar = false>
KVPD_INLINE void plan_row_generic(const RowIO& io, Workspace& ws) {
  plan_row_with<kAllScalar>(io, ws, [](Workspace& w, uint32_t last) KVPD_LAMBDA_INLINE {
    return rank_suffix_scalar(w, last);
  });
}

}  // namespace kvpd_ascend
