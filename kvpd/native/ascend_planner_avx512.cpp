// SPDX-License-Identifier: Apache-2.0
// AVX-512 row planner for kvpd.native._ascend_planner: the phases of ascend_planner_row.hpp 16
// slots / LRU entries / top-k positions at a time, with gathers for the bitmap and rank lookups
// and in-register compress for the hit / evictable split. Compiled for the avx512 target only
// (chosen at load time when the CPU has it); tails, corrupt state and tokens repeated within one
// vector take the shared scalar code, so every path gives the same result.

#if defined(__x86_64__)
#include <immintrin.h>

#include <cstring>

#include "ascend_planner_row.hpp"

#define KVPD_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512cd,popcnt,bmi2")))

namespace kvpd_ascend {

namespace {

// Population count of each 32-bit lane (AVX512-BW nibble lookup; VPOPCNTD is not on every
// AVX-512 CPU).
KVPD_AVX512 KVPD_INLINE __m512i popcount32(__m512i v) {
  const __m512i lut = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4));
  const __m512i low = _mm512_set1_epi8(0x0f);
  const __m512i lo = _mm512_shuffle_epi8(lut, _mm512_and_si512(v, low));
  const __m512i hi = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(v, 4), low));
  const __m512i bytes = _mm512_add_epi8(lo, hi);
  const __m512i pairs = _mm512_maddubs_epi16(bytes, _mm512_set1_epi8(1));
  return _mm512_madd_epi16(pairs, _mm512_set1_epi16(1));
}

// Rank of each (valid) token among the row's distinct marked tokens.
KVPD_AVX512 KVPD_INLINE __m512i rank16(__mmask16 valid, __m512i t, const uint32_t* mark,
                                       const uint32_t* rank_base) {
  const __m512i zero = _mm512_setzero_si512();
  const __m512i w = _mm512_srli_epi32(t, 5);
  const __m512i bits = _mm512_mask_i32gather_epi32(zero, valid, w, mark, 4);
  const __m512i base = _mm512_mask_i32gather_epi32(zero, valid, w, rank_base, 4);
  const __m512i below = _mm512_sub_epi32(
      _mm512_sllv_epi32(_mm512_set1_epi32(1), _mm512_and_si512(t, _mm512_set1_epi32(31))),
      _mm512_set1_epi32(1));
  return _mm512_add_epi32(base, popcount32(_mm512_and_si512(bits, below)));
}

// rank_base for words 0..last_word, 16 at a time (in-register prefix sum); returns the total.
KVPD_AVX512 KVPD_INLINE uint32_t rank_prefix16(Workspace& ws, uint32_t last_word) {
  const uint32_t* mark = ws.mark.data();
  uint32_t* rank_base = ws.rank_base.data();
  const __m512i zero = _mm512_setzero_si512();
  __m512i base = zero;  // running total, broadcast
  uint32_t w = 0;
  for (; w + 16 <= last_word + 1; w += 16) {
    const __m512i cnt = popcount32(_mm512_loadu_si512(mark + w));
    __m512i inc = cnt;  // inclusive prefix sum across the 16 lanes
    inc = _mm512_add_epi32(inc, _mm512_alignr_epi32(inc, zero, 15));
    inc = _mm512_add_epi32(inc, _mm512_alignr_epi32(inc, zero, 14));
    inc = _mm512_add_epi32(inc, _mm512_alignr_epi32(inc, zero, 12));
    inc = _mm512_add_epi32(inc, _mm512_alignr_epi32(inc, zero, 8));
    _mm512_storeu_si512(rank_base + w, _mm512_add_epi32(base, _mm512_sub_epi32(inc, cnt)));
    base = _mm512_add_epi32(base, _mm512_permutexvar_epi32(_mm512_set1_epi32(15), inc));
  }
  uint32_t distinct = static_cast<uint32_t>(_mm_cvtsi128_si32(_mm512_castsi512_si128(base)));
  for (; w <= last_word; ++w) {
    rank_base[w] = distinct;
    distinct += static_cast<uint32_t>(__builtin_popcount(mark[w]));
  }
  return distinct;
}

// mark_row with the valid count and the last word found 16 positions at a time, so that the
// scalar loop left does only the bit setting (a scatter cannot OR).
KVPD_AVX512 KVPD_INLINE RowMarks mark_row16(const RowIO& io, Workspace& ws, uint32_t* n_valid) {
  reset_on_new_request(io);
  const int32_t* topk = io.topk;
  const int32_t k = io.k;
  const __m512i vmax = _mm512_set1_epi32(io.max_token);
  __m512i top = _mm512_setzero_si512();
  uint32_t valid = 0;
  int32_t p = 0;
  for (; p + 16 <= k; p += 16) {
    const __m512i t = _mm512_loadu_si512(topk + p);
    const __mmask16 ok = _mm512_cmplt_epu32_mask(t, vmax);
    valid += static_cast<uint32_t>(__builtin_popcount(ok));
    top = _mm512_mask_max_epu32(top, ok, top, t);
  }
  uint32_t last = static_cast<uint32_t>(_mm512_reduce_max_epu32(top));
  const uint32_t umax = static_cast<uint32_t>(io.max_token);
  for (int32_t q = p; q < k; ++q) {
    const uint32_t t = static_cast<uint32_t>(topk[q]);
    if (t < umax) {
      ++valid;
      last = std::max(last, t);
    }
  }
  uint32_t* __restrict__ mark = ws.mark.data();
  for (int32_t q = 0; q < k; ++q) {
    const uint32_t t = static_cast<uint32_t>(topk[q]);
    if (t < umax) mark[t >> 5] |= 1u << (t & 31);
  }
  *n_valid = valid;
  return {std::min(std::max(io.stable_in, 0), io.max_token), last >> 5, false};
}

KVPD_AVX512 KVPD_INLINE void store_n(int32_t* dst, __mmask16 keep, __m512i v) {
  // Compress in a register, then one masked store: faster than a memory-form compress store.
  const int n = __builtin_popcount(keep);
  _mm512_mask_storeu_epi32(dst, static_cast<__mmask16>((1u << n) - 1),
                           _mm512_maskz_compress_epi32(keep, v));
}

}  // namespace

KVPD_AVX512 void plan_row_avx512(const RowIO& io, Workspace& ws) {
  uint32_t n_valid = 0;
  RowMarks marks = mark_row16(io, ws, &n_valid);
  begin_ranks(ws, &marks, n_valid, rank_prefix16(ws, marks.last_word));
  const int32_t stable = marks.stable;
  const uint32_t* mark = ws.mark.data();
  const uint32_t* rank_base = ws.rank_base.data();
  const __m512i zero = _mm512_setzero_si512();
  const __m512i minus1 = _mm512_set1_epi32(-1);
  const __m512i one = _mm512_set1_epi32(1);
  const __m512i v31 = _mm512_set1_epi32(31);
  const __m512i vmax = _mm512_set1_epi32(io.max_token);

  const __m512i vcap = _mm512_set1_epi32(io.c);
  const __m512i vstable = _mm512_set1_epi32(stable);
  int32_t* hits = ws.hits.data();
  int32_t* sor = ws.slot_of_rank.data();
  uint16_t* hit_slots = ws.hit_slots.data();  // bit per slot: its token is in this step's set
  std::memset(hit_slots, 0, ws.hit_slots.size() * sizeof(uint16_t));

  // Pass A (classify_slots_scalar's work, 16 slots at a time).
  const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  int32_t s0 = 0;
  for (; s0 + 16 <= io.c; s0 += 16) {
    const __m512i t = _mm512_loadu_si512(io.slot_to_token + s0);
    __mmask16 valid = _mm512_cmplt_epu32_mask(t, vmax);
    const __mmask16 spec = _mm512_mask_cmpge_epi32_mask(valid, t, vstable);
    if (spec) {
      _mm512_mask_storeu_epi32(io.slot_to_token + s0, spec, minus1);
      valid &= static_cast<__mmask16>(~spec);
    }
    const __m512i wi = _mm512_srli_epi32(t, 5);
    const __m512i w = _mm512_mask_i32gather_epi32(zero, valid, wi, mark, 4);
    const __m512i low = _mm512_and_si512(t, v31);
    const __mmask16 hit = _mm512_mask_test_epi32_mask(valid, _mm512_srlv_epi32(w, low), one);
    if (hit) {
      const __m512i base = _mm512_mask_i32gather_epi32(zero, hit, wi, rank_base, 4);
      const __m512i below = _mm512_sub_epi32(_mm512_sllv_epi32(one, low), one);
      const __m512i r = _mm512_add_epi32(base, popcount32(_mm512_and_si512(w, below)));
      _mm512_mask_i32scatter_epi32(sor, hit, r, _mm512_add_epi32(lanes, _mm512_set1_epi32(s0)), 4);
    }
    hit_slots[s0 >> 4] = hit;
  }
  classify_slots_scalar(io, ws, stable, s0);

  // Pass B (split_lru_scalar's work, 16 entries at a time).
  const __m512i v15 = _mm512_set1_epi32(15);
  int32_t i = 0, ne = 0, nh = 0;
  for (; i + 16 <= io.c; i += 16) {
    const __m512i s = _mm512_loadu_si512(io.lru + i);
    if (_mm512_cmplt_epu32_mask(s, vcap) != 0xFFFF) break;  // corrupt state: scalar from here
    const __m512i hw = _mm512_i32gather_epi32(_mm512_srli_epi32(s, 4), hit_slots, 2);
    const __mmask16 hit =
        _mm512_test_epi32_mask(_mm512_srlv_epi32(hw, _mm512_and_si512(s, v15)), one);
    store_n(hits + nh, hit, s);
    nh += __builtin_popcount(hit);
    store_n(io.lru + ne, static_cast<__mmask16>(~hit), s);  // ne <= i: entries already read
    ne += 16 - __builtin_popcount(hit);
  }
  split_lru_scalar(io, ws, i, &ne, &nh);

  // Resolve the top-k positions 16 at a time; vectors whose misses repeat a token, or that
  // would run out of evictable slots, take the scalar path (same result).
  int32_t p = 0, m = 0;
  for (; p + 16 <= io.k; p += 16) {
    const __m512i t = _mm512_loadu_si512(io.topk + p);
    const __mmask16 valid = _mm512_cmplt_epu32_mask(t, vmax);
    const __m512i r = rank16(valid, t, mark, rank_base);
    const __m512i have = _mm512_mask_i32gather_epi32(minus1, valid, r, sor, 4);
    const __mmask16 miss = _mm512_mask_cmplt_epi32_mask(valid, have, zero);
    if (!miss) {
      _mm512_storeu_si512(io.current_slots + p, _mm512_mask_mov_epi32(minus1, valid, have));
      continue;
    }
    const int nm = __builtin_popcount(miss);
    bool dup = false;
    if (marks.duplicates) {  // only then can a token repeat within or across vectors
      const __m512i conflicts =
          _mm512_maskz_conflict_epi32(miss, _mm512_mask_mov_epi32(minus1, miss, r));
      dup = _mm512_mask_test_epi32_mask(miss, conflicts,
                                        _mm512_set1_epi32(static_cast<int32_t>(miss))) != 0;
    }
    if (dup || m + nm > ne) {
      resolve_scalar(io, ws, p, p + 16, ne, &m);
      continue;
    }
    const __m512i slots = _mm512_maskz_expandloadu_epi32(miss, io.lru + m);
    if (marks.duplicates) _mm512_mask_i32scatter_epi32(sor, miss, r, slots, 4);
    _mm512_mask_i32scatter_epi32(io.slot_to_token, miss, slots, t, 4);
    store_n(io.miss_tokens + m, miss, t);
    store_n(io.miss_slots + m, miss, slots);
    m += nm;
    const __m512i cur = _mm512_mask_mov_epi32(have, miss, slots);
    _mm512_storeu_si512(io.current_slots + p, _mm512_mask_mov_epi32(minus1, valid, cur));
  }
  resolve_scalar(io, ws, p, io.k, ne, &m);
  finish_row(io, ws, m, ne, nh, marks.last_word);
}

}  // namespace kvpd_ascend

#endif  // __x86_64__
