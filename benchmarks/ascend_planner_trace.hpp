// SPDX-License-Identifier: Apache-2.0
// The trace files benchmarks/ascend_planner_phases.py writes (topk.bin, req.bin, stable.bin), read
// by the C++ harnesses that plan them (ascend_planner_phases.cpp, ascend_planner_cachesim.cpp).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

// `n` values of type T from `path`; exits with a message if the file is shorter.
template <typename T>
std::vector<T> load_trace(const std::string& path, size_t n) {
  std::vector<T> v(n);
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr || std::fread(v.data(), sizeof(T), n, f) != n) {
    std::fprintf(stderr, "cannot read %s\n", path.c_str());
    std::exit(2);
  }
  std::fclose(f);
  return v;
}
