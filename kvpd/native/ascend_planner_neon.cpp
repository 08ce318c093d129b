// SPDX-License-Identifier: Apache-2.0
// NEON row planner for kvpd.native._ascend_planner (aarch64: Kunpeng and every ARMv8-A host).
//
// Advanced SIMD is part of ARMv8-A, so every aarch64 host runs this path; it is still chosen at
// load time from the auxiliary vector (HWCAP_ASIMD), like the x86 paths from CPUID, so a kernel
// that hides it gets the baseline. What it replaces: the rank suffix over the row's token bitmap
// (rank_base[w] = marked tokens in 64-bit words after w), four words per step with the byte
// population count (CNT) and a lane scan, instead of one word and one popcount per step. The
// walk and the resolve phases are the shared scalar code (plan_row_with), which GCC compiles
// with NEON's CNT for the single-word popcounts of the ranks; so results are those of the
// baseline path bit for bit.
//
// SVE: the same row planner compiled with SVE enabled (plan_row_sve; GCC then vectorises the
// slot-order pass and the mark loop with predicated SVE loops), chosen only when named
// (KVPD_NATIVE_ISA=sve): Kunpeng 920 has no SVE, and here it can only be checked for
// correctness under qemu, never timed, so nothing says it beats NEON on the CPUs that have it.

#if defined(__aarch64__)
#include <arm_neon.h>

#include "ascend_planner_row64.hpp"

namespace kvpd_ascend {
namespace {

// rank_base[w] = marked tokens in the 64-bit bitmap words after w, for w <= last_word, four
// words at a time from the top; returns the marked total (rank_suffix_scalar's result).
KVPD_INLINE uint32_t rank_suffix_neon(Workspace& ws, uint32_t last_word) {
  const uint64_t* __restrict__ mark = ws.bits<uint64_t>();
  uint32_t* __restrict__ suffix = ws.rank_base.data();
  const uint32x4_t zero = vdupq_n_u32(0);
  uint32_t above = 0;
  int64_t w = last_word;  // words w, w - 1, ..., 0 are left
  for (; (w + 1) % 4 != 0; --w) {  // the top words, until a multiple of four is left
    suffix[w] = above;
    above += popcount(mark[w]);
  }
  for (; w >= 3; w -= 4) {
    // Popcount of words w-3..w: byte counts (CNT), widened pairwise to one count per 64-bit
    // lane, then the four counts narrowed into one vector of 32-bit lanes.
    const uint8x16_t lo = vcntq_u8(vreinterpretq_u8_u64(vld1q_u64(mark + w - 3)));
    const uint8x16_t hi = vcntq_u8(vreinterpretq_u8_u64(vld1q_u64(mark + w - 1)));
    const uint64x2_t lo64 = vpaddlq_u32(vpaddlq_u16(vpaddlq_u8(lo)));
    const uint64x2_t hi64 = vpaddlq_u32(vpaddlq_u16(vpaddlq_u8(hi)));
    const uint32x4_t counts = vcombine_u32(vmovn_u64(lo64), vmovn_u64(hi64));
    // Inclusive scan across the four lanes (lane i: words w-3..w-3+i); a word's suffix is what
    // is above the group plus the group's total less that scan.
    uint32x4_t scan = vaddq_u32(counts, vextq_u32(zero, counts, 3));
    scan = vaddq_u32(scan, vextq_u32(zero, scan, 2));
    const uint32_t total = vgetq_lane_u32(scan, 3);
    vst1q_u32(suffix + w - 3, vsubq_u32(vdupq_n_u32(above + total), scan));
    above += total;
  }
  return above;
}

}  // namespace

void plan_row_neon(const RowIO& io, Workspace& ws) {
  plan_row_with(io, ws, [](Workspace& w, uint32_t last) KVPD_LAMBDA_INLINE {
    return rank_suffix_neon(w, last);
  });
}

// The NEON path's row planner with SVE enabled for the compiler (see the top of this file).
__attribute__((target("+sve"))) void plan_row_sve(const RowIO& io, Workspace& ws) {
  plan_row_generic(io, ws);
}

}  // namespace kvpd_ascend

#endif  // __aarch64__
