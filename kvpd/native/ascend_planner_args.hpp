// SPDX-License-Identifier: Apache-2.0
// compute_lru_resident_addrs' Python entry point, the checked front of compute_addrs_raw
// (ascend_planner_args.cpp), as the module in ascend_planner.cpp adds it.

#pragma once

#include <pybind11/pybind11.h>

namespace kvpd_ascend {

namespace py = pybind11;

// Adds compute_lru_resident_addrs (its checked Python entry point) to the module.
void bind_compute_lru_resident_addrs(py::module_& m);

}  // namespace kvpd_ascend
