// SPDX-License-Identifier: Apache-2.0
// Where the portable row planner's time goes: the phases of plan_row_with
// (kvpd/native/ascend_planner_row64.hpp) timed with the time-stamp counter, one layer's rows one
// after another on one thread, as lru_resident_compact plans them. Built and run by
// benchmarks/ascend_planner_phases.py, which writes the trace files this reads.
//
//   -DKVPD_PHASES     time each phase (rdtsc between phases; adds ~1% to the total)
//   -DROWS_RESIDENT=N plan only the first N rows (N=8: every row's state stays in L2)
//   -DNO_PREFETCH     do not fetch the next row's state ahead
//   -DBRANCHY_RESOLVE resolve every row with resolve_scalar (a branch on each miss)
//
// argv: trace directory, steps, rows, topk, capacity, max_token, repeats. Prints the mean over
// steps (after 3 warm-up steps) of the minimum over repeats, per layer and per phase.
#include <x86intrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#ifdef KVPD_PHASES
static uint64_t g_acc[16];
static uint64_t g_last;
// plan_row_with's own split points (kvpd_ascend::RowPhase): the time since the last one.
#define KVPD_PHASE(i)                 \
  {                                   \
    const uint64_t now = __rdtsc();   \
    g_acc[i] += now - g_last;         \
    g_last = now;                     \
  }
#endif

#include "../kvpd/native/ascend_planner_row64.hpp"
#include "ascend_planner_trace.hpp"

using namespace kvpd_ascend;

static const char* const kNames[kRowPhases] = {
    "mark top-k bitmap", "rank suffix", "walk: slot-order drop/check", "walk: LRU-order split",
    "walk: ranks of hits", "resolve positions + misses", "finish lists"};

static void plan_row(const RowIO& io, Workspace& ws) {
#ifdef KVPD_PHASES
  g_last = __rdtsc();
#endif
  // BRANCHY_RESOLVE: every row resolved by resolve_scalar (a branch on each miss).
#ifdef BRANCHY_RESOLVE
  constexpr bool kBranchy = true;
#else
  constexpr bool kBranchy = false;
#endif
  plan_row_generic<kBranchy>(io, ws);
}

int main(int argc, char** argv) {
  if (argc != 8) {
    std::fprintf(stderr, "usage: %s DIR STEPS ROWS TOPK CAPACITY MAX_TOKEN REPEATS\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  const int steps = std::atoi(argv[2]), rows0 = std::atoi(argv[3]), k = std::atoi(argv[4]);
  const int c = std::atoi(argv[5]), max_token = std::atoi(argv[6]), reps = std::atoi(argv[7]);
#ifdef ROWS_RESIDENT
  const int rows = std::min(rows0, ROWS_RESIDENT);
#else
  const int rows = rows0;
#endif
  const auto topk = load_trace<int32_t>(dir + "/topk.bin", size_t(steps) * rows0 * k);
  const auto req = load_trace<int64_t>(dir + "/req.bin", size_t(steps) * rows0);
  const auto stable = load_trace<int32_t>(dir + "/stable.bin", size_t(steps) * rows0);
  std::vector<int64_t> last(rows);
  std::vector<int32_t> stt(size_t(rows) * c), lru(size_t(rows) * c), cur(size_t(rows) * k),
      mt(size_t(rows) * k), ms(size_t(rows) * k), mc(rows);
  Workspace ws;
  ws.fit(max_token, k, c);
  const int warm = 3;
  std::vector<double> best(steps, 1e30);
  std::vector<uint64_t> best_acc(kRowPhases, UINT64_MAX);
  for (int rep = 0; rep < reps; ++rep) {
    std::fill(last.begin(), last.end(), -1);
    std::fill(stt.begin(), stt.end(), -1);
    for (int r = 0; r < rows; ++r) {
      for (int s = 0; s < c; ++s) lru[size_t(r) * c + s] = s;
    }
    uint64_t acc[kRowPhases] = {};
    for (int step = 0; step < steps; ++step) {
#ifdef KVPD_PHASES
      std::fill(g_acc, g_acc + kRowPhases, 0);
#endif
      const auto t0 = std::chrono::steady_clock::now();
      const size_t first = size_t(step) * rows0;  // this step's rows in the trace
      const LayerIO layer{topk.data() + first * k, req.data() + first, stable.data() + first,
                          last.data(), stt.data(), lru.data(), cur.data(), mt.data(),
                          ms.data(), mc.data(), k, c, max_token};
      for (int r = 0; r < rows; ++r) {
#ifdef NO_PREFETCH
        const int next = -1;
#else
        const int next = r + 1 < rows ? r + 1 : -1;
#endif
        plan_row(layer.row(r, next), ws);
      }
      const double ms_layer =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (step >= warm) {
        best[step] = std::min(best[step], ms_layer);
#ifdef KVPD_PHASES
        for (int i = 0; i < kRowPhases; ++i) acc[i] += g_acc[i];
#endif
      }
    }
    for (int i = 0; i < kRowPhases; ++i) best_acc[i] = std::min(best_acc[i], acc[i]);
  }
  double sum = 0;
  for (int step = warm; step < steps; ++step) sum += best[step];
  std::printf("layer_ms %.4f\n", sum / (steps - warm));
#ifdef KVPD_PHASES
  for (int i = 0; i < kRowPhases; ++i) {
    std::printf("phase %s|%.0f\n", kNames[i], double(best_acc[i]) / double(steps - warm) / rows);
  }
#endif
  return 0;
}
