// SPDX-License-Identifier: Apache-2.0
// NEON row planner for kvpd.native._ascend_planner (aarch64: Kunpeng and every ARMv8-A host).
//
// Advanced SIMD is part of ARMv8-A, so every aarch64 host runs this path; it is still chosen at
// load time from the auxiliary vector (HWCAP_ASIMD), like the x86 paths from CPUID, so a kernel
// that hides it gets the baseline. What it replaces: the rank prefix over the row's token bitmap
// (rank_base[w] = marked tokens in 64-bit words before w), four words per step with the byte
// population count (CNT) and a lane scan, instead of one word and one popcount per step. The walk and the
// resolve phases are the shared scalar code (plan_row_with), which GCC compiles with NEON's CNT
// for the single-word popcounts of rank_of; so results are those of the baseline path bit for
// bit.
//
// SVE: the same row planner compiled with SVE enabled (plan_row_sve; GCC then vectorises the
// slot-order pass and the mark loop with predicated SVE loops), chosen only when named
// (KVPD_NATIVE_ISA=sve): Kunpeng 920 has no SVE, and here it can only be checked for
// correctness under qemu, never timed, so nothing says it beats NEON on the CPUs that have it.

#if defined(__aarch64__)
#include <arm_neon.h>

#include "ascend_planner_row.hpp"

namespace kvpd_ascend {
namespace {

// rank_base[w] for w <= last_word, four 64-bit bitmap words at a time; returns the marked total.
KVPD_INLINE uint32_t rank_prefix_neon(Workspace& ws, uint32_t last_word) {
  const uint64_t* __restrict__ mark = ws.bits<uint64_t>();
  uint32_t* __restrict__ rank_base = ws.rank_base.data();
  const uint32x4_t zero = vdupq_n_u32(0);
  uint32_t distinct = 0;
  uint32_t w = 0;
  for (; w + 4 <= last_word + 1; w += 4) {
    // Popcount of each word: byte counts (CNT), widened pairwise to one count per 64-bit lane,
    // then the four counts narrowed into one vector of 32-bit lanes.
    const uint8x16_t lo = vcntq_u8(vreinterpretq_u8_u64(vld1q_u64(mark + w)));
    const uint8x16_t hi = vcntq_u8(vreinterpretq_u8_u64(vld1q_u64(mark + w + 2)));
    const uint64x2_t lo64 = vpaddlq_u32(vpaddlq_u16(vpaddlq_u8(lo)));
    const uint64x2_t hi64 = vpaddlq_u32(vpaddlq_u16(vpaddlq_u8(hi)));
    const uint32x4_t counts = vcombine_u32(vmovn_u64(lo64), vmovn_u64(hi64));
    // Inclusive scan across the four lanes, then exclusive = inclusive - own count.
    uint32x4_t scan = vaddq_u32(counts, vextq_u32(zero, counts, 3));
    scan = vaddq_u32(scan, vextq_u32(zero, scan, 2));
    const uint32x4_t base = vaddq_u32(vsubq_u32(scan, counts), vdupq_n_u32(distinct));
    vst1q_u32(rank_base + w, base);
    distinct += vgetq_lane_u32(scan, 3);
  }
  for (; w <= last_word; ++w) {
    rank_base[w] = distinct;
    distinct += popcount(mark[w]);
  }
  return distinct;
}

}  // namespace

void plan_row_neon(const RowIO& io, Workspace& ws) {
  plan_row_with(io, ws, [](Workspace& w, uint32_t last) KVPD_LAMBDA_INLINE {
    return rank_prefix_neon(w, last);
  });
}

// The NEON path's row planner with SVE enabled for the compiler (see the top of this file).
__attribute__((target("+sve"))) void plan_row_sve(const RowIO& io, Workspace& ws) {
  plan_row_generic(io, ws);
}

}  // namespace kvpd_ascend

#endif  // __aarch64__
