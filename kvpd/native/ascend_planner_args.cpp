// SPDX-License-Identifier: Apache-2.0
// compute_lru_resident_addrs' Python boundary for kvpd.native._ascend_planner: takes the CPU
// tensors the manager passes (torch.Tensor) or NumPy arrays, checks dtype, rank, layout and
// sizes like upstream's TORCH_CHECKs (as ValueError naming the argument), and hands raw
// addresses to the core. In C++ because it runs for every layer of every decode step: reading
// eight arrays' addresses through Python attributes costs more than computing the descriptors.

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ascend_planner_args.hpp"
#include "py_int_args.hpp"

namespace py = pybind11;

namespace kvpd_ascend {

int64_t compute_addrs_raw(uintptr_t miss_count, uintptr_t miss_tokens, uintptr_t miss_slots,
                          int64_t rows, int64_t k, uintptr_t block_table, int64_t blocks_per_row,
                          bool block_table_int64, int64_t block_size, int64_t tok_k, int64_t tok_v,
                          uint64_t src_k, uint64_t src_v, uint64_t dst_k, uint64_t dst_v,
                          int64_t capacity, int64_t max_threads, uintptr_t gvas, uintptr_t addr,
                          uintptr_t size, uintptr_t num);

namespace {

[[noreturn]] void fail(const std::string& msg) { throw py::value_error(msg); }

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

struct View {
  uintptr_t ptr = 0;
  std::vector<int64_t> shape;
  bool int64 = false;
};

// An attribute name, interned once: the lookups below run eight times a descriptor call.
PyObject* interned(const char* name) { return PyUnicode_InternFromString(name); }

// torch.int32 or torch.int64, once torch is imported (nullptr before: kvpd never imports it).
// torch's dtypes are singletons, so a tensor's dtype is one of them by identity.
PyObject* torch_dtype(bool int64) {
  static PyObject* found[2] = {nullptr, nullptr};
  PyObject*& slot = found[int64 ? 1 : 0];
  if (slot != nullptr) return slot;
  static PyObject* const torch_name = interned("torch");
  PyObject* torch = PyImport_GetModule(torch_name);  // new reference, or nullptr
  if (torch == nullptr) {
    PyErr_Clear();
    return nullptr;
  }
  slot = PyObject_GetAttrString(torch, int64 ? "int64" : "int32");  // kept for the process
  Py_DECREF(torch);
  if (slot == nullptr) PyErr_Clear();
  return slot;
}

// A new reference to h.<name>() or h.<name>, or nullptr (no error left set).
PyObject* get(PyObject* h, PyObject* name, bool call) {
  PyObject* r = call ? PyObject_CallMethodNoArgs(h, name) : PyObject_GetAttr(h, name);
  if (r == nullptr) PyErr_Clear();
  return r;
}

// A CPU torch.Tensor of int32 or int64, C-contiguous, read through five lookups on the C API:
// the general path below converts the dtype and device to strings and walks the shape through
// pybind11, 13 us for a descriptor call's eight tensors against 1.5 us for NumPy arrays (Zen 4).
// False for anything else, unusual or failing, which the general path then takes (and words
// the error).
bool torch_view(PyObject* h, View* v) {
  static PyObject* const dtype = interned("dtype");
  static PyObject* const is_cpu = interned("is_cpu");
  static PyObject* const shape = interned("shape");
  static PyObject* const is_contiguous = interned("is_contiguous");
  static PyObject* const data_ptr = interned("data_ptr");
  PyObject* const i32 = torch_dtype(false);
  PyObject* const i64 = torch_dtype(true);
  if (i32 == nullptr || i64 == nullptr) return false;
  PyObject* dt = get(h, dtype, false);
  if (dt == nullptr) return false;
  const bool int64 = dt == i64, known = dt == i32 || int64;
  Py_DECREF(dt);
  if (!known) return false;
  bool ok = false;
  PyObject* cpu = get(h, is_cpu, false);
  PyObject* dims = cpu == Py_True ? get(h, shape, false) : nullptr;
  PyObject* contig = dims != nullptr && PyTuple_Check(dims) ? get(h, is_contiguous, true) : nullptr;
  PyObject* ptr = contig == Py_True ? get(h, data_ptr, true) : nullptr;
  if (ptr != nullptr && PyLong_Check(ptr)) {
    v->ptr = static_cast<uintptr_t>(PyLong_AsUnsignedLongLong(ptr));
    v->int64 = int64;
    v->shape.clear();
    ok = !PyErr_Occurred();
    for (Py_ssize_t i = 0; ok && i < PyTuple_GET_SIZE(dims); ++i) {
      v->shape.push_back(PyLong_AsLongLong(PyTuple_GET_ITEM(dims, i)));
      ok = !PyErr_Occurred();
    }
    if (!ok) PyErr_Clear();
  }
  Py_XDECREF(ptr);
  Py_XDECREF(contig);
  Py_XDECREF(dims);
  Py_XDECREF(cpu);
  return ok;
}

// A C-contiguous CPU torch.Tensor or NumPy array of int32 (or int64 when `allow64`/`want64`).
View view(py::handle h, const char* name, int ndim, bool want64, bool allow_both, bool out) {
  View v;
  const char* want = want64 ? "int64" : "int32";
  std::string dtype;
  bool contiguous = false, writeable = true;
  if (py::isinstance<py::array>(h)) {
    auto a = py::reinterpret_borrow<py::array>(h);
    if (a.dtype().equal(py::dtype::of<int32_t>())) dtype = "int32";
    else if (a.dtype().equal(py::dtype::of<int64_t>())) dtype = "int64";
    else dtype = py::str(a.dtype()).cast<std::string>();
    for (py::ssize_t i = 0; i < a.ndim(); ++i) v.shape.push_back(a.shape(i));
    contiguous = (a.flags() & py::array::c_style) != 0;
    writeable = a.writeable();
    v.ptr = reinterpret_cast<uintptr_t>(a.data());
  } else if (torch_view(h.ptr(), &v)) {  // the manager's tensors (dtype and rank: below)
    dtype = v.int64 ? "int64" : "int32";
    contiguous = true;
  } else if (py::hasattr(h, "data_ptr")) {  // torch.Tensor, without importing torch
    dtype = py::str(h.attr("dtype")).cast<std::string>();
    if (dtype.rfind("torch.", 0) == 0) dtype = dtype.substr(6);
    for (auto d : h.attr("shape")) v.shape.push_back(d.cast<int64_t>());
    const std::string device = py::str(h.attr("device").attr("type")).cast<std::string>();
    if (device != "cpu") {
      fail(std::string(name) + " must be on the CPU, got device " +
           py::str(h.attr("device")).cast<std::string>());
    }
    contiguous = h.attr("is_contiguous")().cast<bool>();
    v.ptr = h.attr("data_ptr")().cast<uintptr_t>();
  } else {
    fail(std::string(name) + " must be a CPU tensor or numpy array, got " +
         py::str(py::type::handle_of(h).attr("__name__")).cast<std::string>());
  }
  const bool ok = dtype == want || (allow_both && (dtype == "int32" || dtype == "int64"));
  if (!ok) {
    fail(std::string(name) + " must have dtype " + (allow_both ? "int32 or int64" : want) +
         ", got " + dtype);
  }
  v.int64 = dtype == "int64";
  if (static_cast<int>(v.shape.size()) != ndim) {
    fail(std::string(name) + " must be " + std::to_string(ndim) + "-D, got shape " +
         shape_str(v.shape));
  }
  if (!contiguous) fail(std::string(name) + " must be C-contiguous");
  if (out && !writeable) fail(std::string(name) + " is an output and must be writeable");
  return v;
}

using kvpd_native::int_in;

uint64_t address(py::handle h, const char* name) {
  const py::int_ v = kvpd_native::index_of(h, name);
  const unsigned long long u = PyLong_AsUnsignedLongLong(v.ptr());
  if (PyErr_Occurred()) {
    PyErr_Clear();
    fail(std::string(name) + " must be in [0, 2**64), got " + py::str(v).cast<std::string>());
  }
  return u;
}

constexpr int64_t kI32 = 2147483647;

}  // namespace

int64_t compute_lru_resident_addrs(py::handle miss_count, py::handle miss_tokens,
                                   py::handle miss_slots, py::handle block_table,
                                   py::handle block_size, py::handle tok_k, py::handle tok_v,
                                   py::handle gvas_k_base, py::handle gvas_v_base,
                                   py::handle addr_k_base, py::handle addr_v_base,
                                   py::handle capacity, py::handle max_threads, py::handle gvas,
                                   py::handle addr, py::handle size, py::handle num) {
  const View mc = view(miss_count, "miss_count", 1, false, false, false);
  const View mt = view(miss_tokens, "miss_tokens", 2, false, false, false);
  const View ms = view(miss_slots, "miss_slots", 2, false, false, false);
  const int64_t rows = mt.shape[0], k = mt.shape[1];
  if (ms.shape != mt.shape) {
    fail("miss_slots must have the shape of miss_tokens " + shape_str(mt.shape) + ", got " +
         shape_str(ms.shape));
  }
  if (mc.shape[0] < rows) {
    fail("miss_count must have at least " + std::to_string(rows) + " entries, got " +
         std::to_string(mc.shape[0]));
  }
  const View bt = view(block_table, "block_table", 2, false, true, false);
  if (bt.shape[0] < rows) {
    fail("block_table must have at least " + std::to_string(rows) + " rows, got " +
         std::to_string(bt.shape[0]));
  }
  const int64_t need = 2 * rows * k;
  View outs[3];
  const char* names[3] = {"gvas", "addr", "size"};
  const py::handle objs[3] = {gvas, addr, size};
  for (int i = 0; i < 3; ++i) {
    outs[i] = view(objs[i], names[i], 1, i < 2, false, true);
    if (outs[i].shape[0] < need) {
      fail(std::string(names[i]) + " must have at least " + std::to_string(need) +
           " entries (2 x rows x topk), got " + std::to_string(outs[i].shape[0]));
    }
  }
  const View n = view(num, "num", 1, false, false, true);
  if (n.shape[0] < 1) fail("num must have at least 1 entry");
  return compute_addrs_raw(
      mc.ptr, mt.ptr, ms.ptr, rows, k, bt.ptr, bt.shape[1], bt.int64,
      int_in(block_size, "block_size", 1, kI32), int_in(tok_k, "tok_k", 1, kI32),
      int_in(tok_v, "tok_v", 1, kI32), address(gvas_k_base, "gvas_k_base"),
      address(gvas_v_base, "gvas_v_base"), address(addr_k_base, "addr_k_base"),
      address(addr_v_base, "addr_v_base"), int_in(capacity, "capacity", 1, kI32),
      int_in(max_threads, "max_threads", -kI32, kI32), outs[0].ptr, outs[1].ptr, outs[2].ptr,
      n.ptr);
}

void bind_compute_lru_resident_addrs(py::module_& m) {
  m.def("compute_lru_resident_addrs", &compute_lru_resident_addrs,
        "Host->device copy descriptors of the planned misses written in place into gvas, addr, "
        "size and num (K of all rows, then V; num = 2S); returns S.");
}

}  // namespace kvpd_ascend
