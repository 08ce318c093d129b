// kvpd's own stand-in for <torch/extension.h>, just enough to build vLLM-Ascend's planner .cpp
// (which the user fetches; never shipped here) as a plain pybind11 module over NumPy arrays for
// benchmarks/ascend_planner.py. Not torch: at::Tensor is a NumPy array here.
#pragma once
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace at {
enum ScalarType { kInt, kLong, kOther };

struct __attribute__((visibility("hidden"))) Tensor {
  pybind11::array a;
  int64_t size(int dim) const { return a.shape(dim); }
  ScalarType scalar_type() const {
    if (a.dtype().equal(pybind11::dtype::of<int32_t>())) return kInt;
    if (a.dtype().equal(pybind11::dtype::of<int64_t>())) return kLong;
    return kOther;
  }
  void* data_ptr() const { return const_cast<void*>(a.data()); }
};
}  // namespace at

#define TORCH_CHECK(cond, msg)                          \
  do {                                                  \
    if (!(cond)) throw std::runtime_error(std::string(msg)); \
  } while (0)

namespace pybind11 {
namespace detail {
template <>
struct type_caster<at::Tensor> {
  PYBIND11_TYPE_CASTER(at::Tensor, const_name("ndarray"));
  bool load(handle src, bool) {
    if (!isinstance<array>(src)) return false;
    value.a = reinterpret_borrow<array>(src);
    return true;
  }
  static handle cast(const at::Tensor& t, return_value_policy, handle) {
    return t.a.inc_ref();
  }
};
}  // namespace detail
}  // namespace pybind11
