// SPDX-License-Identifier: Apache-2.0
// One layer's rows planned on one thread, for a cache and branch simulator
// (benchmarks/ascend_planner_cachesim.py runs it under valgrind's callgrind): the portable row
// planner of kvpd/native/ascend_planner_row64.hpp, or, built with -DUPSTREAM_SOURCE="path",
// vLLM-Ascend's own lru_resident_compact from the source the user fetched (compiled against
// kvpd's stand-in headers in benchmarks/upstream_stubs, never shipped). Only measured_layer is
// counted (callgrind --toggle-collect), so the warm-up steps, the trace's loading and the
// process's start are not.
//
// argv: trace directory (benchmarks/ascend_planner_phases.py's files), steps, rows, topk,
// capacity, max_token, warm-up steps.
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "ascend_planner_trace.hpp"

#ifdef UPSTREAM_SOURCE
#include UPSTREAM_SOURCE
#else
#include "../kvpd/native/ascend_planner_row64.hpp"
#endif

namespace {

// One layer's state and buffers in the manager's layout (row-major, one row per request).
struct Layer {
  int rows, k, c, max_token;
  std::vector<int64_t> last;
  std::vector<int32_t> stt, lru, cur, mt, ms, mc;
#ifdef UPSTREAM_SOURCE
  std::vector<int32_t> token_mark, token_pos, slot_ws, miss_pos, epoch;
#else
  kvpd_ascend::Workspace ws;
#endif

  Layer(int rows_, int k_, int c_, int max_token_)
      : rows(rows_), k(k_), c(c_), max_token(max_token_), last(rows_, -1),
        stt(size_t(rows_) * c_, -1), lru(size_t(rows_) * c_), cur(size_t(rows_) * k_),
        mt(size_t(rows_) * k_), ms(size_t(rows_) * k_), mc(rows_) {
    for (int r = 0; r < rows; ++r) {
      for (int s = 0; s < c; ++s) lru[size_t(r) * c + s] = s;
    }
#ifdef UPSTREAM_SOURCE
    token_mark.assign(size_t(max_token), 0);
    token_pos.assign(size_t(max_token), -1);
    slot_ws.assign(size_t(c) * 3, 0);
    miss_pos.assign(size_t(k), 0);
    epoch.assign(1, 0);
#else
    ws.fit(max_token, k, c);
#endif
  }

  void plan(const int32_t* topk, const int64_t* req, const int32_t* stable) {
#ifdef UPSTREAM_SOURCE
    auto p = [](const void* a) { return reinterpret_cast<uintptr_t>(a); };
    lru_resident_compact(p(req), p(last.data()), p(topk), p(stable), p(stt.data()), p(lru.data()),
                         p(cur.data()), p(mc.data()), p(mt.data()), p(ms.data()),
                         p(token_mark.data()), p(token_pos.data()), p(slot_ws.data()),
                         p(miss_pos.data()), p(epoch.data()), rows, k, c, max_token, 1, 1);
#else
    const kvpd_ascend::LayerIO layer{topk,       req,        stable,    last.data(),
                                     stt.data(), lru.data(), cur.data(), mt.data(),
                                     ms.data(),  mc.data(),  k,          c,
                                     max_token};
    for (int r = 0; r < rows; ++r) {  // the next row fetched ahead, as the module does
      kvpd_ascend::plan_row_generic(layer.row(r, r + 1 < rows ? r + 1 : -1), ws);
    }
#endif
  }
};

// Two functions with the same body, so that the simulator counts only the second's calls.
__attribute__((noinline)) void warm_layer(Layer& l, const int32_t* t, const int64_t* q,
                                          const int32_t* s) {
  l.plan(t, q, s);
}
__attribute__((noinline)) void measured_layer(Layer& l, const int32_t* t, const int64_t* q,
                                              const int32_t* s) {
  l.plan(t, q, s);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 8) {
    std::fprintf(stderr, "usage: %s DIR STEPS ROWS TOPK CAPACITY MAX_TOKEN WARM\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  const int steps = std::atoi(argv[2]), rows = std::atoi(argv[3]), k = std::atoi(argv[4]);
  const int c = std::atoi(argv[5]), max_token = std::atoi(argv[6]), warm = std::atoi(argv[7]);
  const auto topk = load_trace<int32_t>(dir + "/topk.bin", size_t(steps) * rows * k);
  const auto req = load_trace<int64_t>(dir + "/req.bin", size_t(steps) * rows);
  const auto stable = load_trace<int32_t>(dir + "/stable.bin", size_t(steps) * rows);
  Layer layer(rows, k, c, max_token);
  for (int step = 0; step < steps; ++step) {
    const int32_t* t = topk.data() + size_t(step) * rows * k;
    const int64_t* q = req.data() + size_t(step) * rows;
    const int32_t* s = stable.data() + size_t(step) * rows;
    (step < warm ? warm_layer : measured_layer)(layer, t, q, s);
  }
  // A digest of the final state, so that the two builds can be checked to agree.
  uint64_t h = 1469598103934665603ull;
  for (int32_t v : layer.lru) h = (h ^ uint32_t(v)) * 1099511628211ull;
  for (int32_t v : layer.stt) h = (h ^ uint32_t(v)) * 1099511628211ull;
  for (int32_t v : layer.cur) h = (h ^ uint32_t(v)) * 1099511628211ull;
  std::printf("state %016llx\n", static_cast<unsigned long long>(h));
  return 0;
}
