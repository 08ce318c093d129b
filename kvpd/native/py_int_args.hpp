// SPDX-License-Identifier: Apache-2.0
// Integer arguments from Python, checked one way by both extensions (_sparse_lru and
// _ascend_planner): bools refused, anything with __index__ accepted, a value out of range
// named with its range. Errors are ValueError, as the Python fallbacks raise.

#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

namespace kvpd_native {

namespace py = pybind11;

// The Python int behind `h` (an integer that is not a bool), or ValueError naming `name`.
inline py::int_ index_of(py::handle h, const char* name) {
  if (PyBool_Check(h.ptr()) || !PyIndex_Check(h.ptr())) {
    throw py::value_error(std::string(name) + " must be an integer, got " +
                          py::str(py::type::handle_of(h).attr("__name__")).cast<std::string>());
  }
  auto v = py::reinterpret_steal<py::int_>(PyNumber_Index(h.ptr()));
  if (!v) throw py::error_already_set();
  return v;
}

// `h` as an int64 in [lo, hi].
inline int64_t int_in(py::handle h, const char* name, int64_t lo, int64_t hi) {
  const py::int_ v = index_of(h, name);
  int overflow = 0;
  const long long x = PyLong_AsLongLongAndOverflow(v.ptr(), &overflow);
  if (overflow || x < lo || x > hi) {
    throw py::value_error(std::string(name) + " must be in [" + std::to_string(lo) + ", " +
                          std::to_string(hi) + "], got " + py::str(v).cast<std::string>());
  }
  return static_cast<int64_t>(x);
}

}  // namespace kvpd_native
