// SPDX-License-Identifier: Apache-2.0
// compute_lru_resident_addrs' Python entry point (defined in ascend_planner_args.cpp, bound in
// ascend_planner.cpp): the checked front of compute_addrs_raw.

#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>

namespace kvpd_ascend {

namespace py = pybind11;

int64_t compute_lru_resident_addrs(py::handle miss_count, py::handle miss_tokens,
                                   py::handle miss_slots, py::handle block_table,
                                   py::handle block_size, py::handle tok_k, py::handle tok_v,
                                   py::handle gvas_k_base, py::handle gvas_v_base,
                                   py::handle addr_k_base, py::handle addr_v_base,
                                   py::handle capacity, py::handle max_threads, py::handle gvas,
                                   py::handle addr, py::handle size, py::handle num);

}  // namespace kvpd_ascend
