// SPDX-License-Identifier: Apache-2.0
// AVX-512 row planner for kvpd.native._ascend_planner: the phases of ascend_planner_row.hpp 16
// slots / LRU entries / top-k positions at a time, with gathers for the bitmap and rank lookups
// and in-register compress for the hit / evictable split. The body (ascend_planner_avx512.inc) is
// compiled twice, for two AVX-512 levels, and the best one the CPU has is chosen at load time;
// tails, corrupt state and tokens repeated within one vector take the shared scalar code, so
// every path gives the same result.

#if defined(__x86_64__)
#include <immintrin.h>

#include <cstring>

#include "ascend_planner_row.hpp"

namespace kvpd_ascend {

// Skylake-SP level: AVX-512 F/CD/BW/DQ/VL (every AVX-512 server CPU since 2017).
namespace skx {
#define KVPD_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512cd,popcnt,bmi2")))
namespace {
// Population count of each 32-bit lane by nibble lookup (AVX512-BW): VPOPCNTD is not on this
// level.
KVPD_AVX512 KVPD_INLINE __m512i popcount32(__m512i v) {
  const __m512i lut = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4));
  const __m512i low = _mm512_set1_epi8(0x0f);
  const __m512i lo = _mm512_shuffle_epi8(lut, _mm512_and_si512(v, low));
  const __m512i hi = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(v, 4), low));
  const __m512i bytes = _mm512_add_epi8(lo, hi);
  const __m512i pairs = _mm512_maddubs_epi16(bytes, _mm512_set1_epi8(1));
  return _mm512_madd_epi16(pairs, _mm512_set1_epi16(1));
}

}  // namespace
#include "ascend_planner_avx512.inc"
#undef KVPD_AVX512
}  // namespace skx

// Ice Lake level: the above plus VPOPCNTD (Ice Lake, Sapphire Rapids and later, Zen 4): the
// rank of a token is one instruction shorter by ~8 vector operations, in three hot loops.
namespace icl {
#define KVPD_AVX512 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512cd,avx512vpopcntdq,popcnt,bmi2")))
namespace {
KVPD_AVX512 KVPD_INLINE __m512i popcount32(__m512i v) { return _mm512_popcnt_epi32(v); }
}  // namespace
#include "ascend_planner_avx512.inc"
#undef KVPD_AVX512
}  // namespace icl

void plan_row_avx512(const RowIO& io, Workspace& ws) { skx::plan_row(io, ws); }
void plan_row_avx512_vpopcnt(const RowIO& io, Workspace& ws) { icl::plan_row(io, ws); }

}  // namespace kvpd_ascend

#endif  // __x86_64__
