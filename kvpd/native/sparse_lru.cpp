// SPDX-License-Identifier: Apache-2.0
// kvpd native core: per-layer, per-row LRU residency planner for the sparse-KV device hot buffer
// and the host->device copy descriptors of its misses. Built as kvpd.native._sparse_lru.
//
// Layout: the *_impl functions in the anonymous namespace hold the OpenMP loops over raw pointers;
// the pybind11 entry points at the bottom validate every argument (ValueError naming it), allocate
// the outputs with the GIL held and release it for the computation. Rows are independent and
// each thread owns its workspace, so results do not depend on the thread count.

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "py_int_args.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace py = pybind11;

#ifndef KVPD_ISA_FLAGS
#define KVPD_ISA_FLAGS "unknown"
#endif

namespace {

int max_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

int thread_id() {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

// Scratch for one thread, all sized to stay in L1/L2. `mark` is a bitmap over token ids (kept
// all-zero between rows); `rank_base[w]` counts the marked tokens in words before w, so a marked
// token's rank among the distinct top-k tokens is rank_base[w] + popcount(lower bits of word w),
// and `slot_of_rank` maps that rank to its slot (-1: not resident yet). This replaces a
// max_model_len-sized token->slot table whose random accesses missed L2.
struct Workspace {
  std::vector<uint64_t> mark;
  std::vector<uint32_t> rank_base;
  std::vector<int32_t> slot_of_rank;
  std::vector<uint64_t> hits;

  Workspace(int64_t max_tokens, int64_t topk, int64_t capacity)
      : mark(static_cast<size_t>(max_tokens / 64 + 1), 0),
        rank_base(static_cast<size_t>(max_tokens / 64 + 1), 0),
        slot_of_rank(static_cast<size_t>(topk + 1), -1),
        hits(static_cast<size_t>(capacity), 0) {}
};

// LRU state entry: token in the high 32 bits (-1 = empty), slot in the low 32 bits. Keeping the
// token next to its slot in LRU order makes the walk sequential (no slot->token lookups).
inline uint64_t pack(int32_t token, int32_t slot) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(token)) << 32) | static_cast<uint32_t>(slot);
}
inline int32_t entry_token(uint64_t e) { return static_cast<int32_t>(e >> 32); }
inline int32_t entry_slot(uint64_t e) { return static_cast<int32_t>(e & 0xFFFFFFFFu); }

void reset_cell(uint64_t* lru, int32_t capacity) {
  for (int32_t s = 0; s < capacity; ++s) lru[s] = pack(-1, s);
}

struct RowOut {
  int32_t* current_slots;
  int32_t* miss_tokens;
  int32_t* miss_slots;
  int32_t* miss_count;
};

// One row of `plan`: hits keep their slot and become most recently used; distinct misses (in
// first-occurrence top-k order) take the least recently used evictable slots. `lru` holds
// `capacity` entries, oldest first, and one readable entry past its end.
void plan_row_impl(const int32_t* __restrict__ topk, int32_t k, int64_t req_id, int32_t stable_in,
                   uint64_t* __restrict__ lru, int64_t* __restrict__ last_req_id,
                   int32_t capacity, int32_t max_tokens, Workspace& ws, const RowOut& out) {
  if (*last_req_id != req_id) {
    reset_cell(lru, capacity);
    *last_req_id = req_id;
  }
  const int32_t stable = std::min(std::max(stable_in, 0), max_tokens);
  uint64_t* __restrict__ mark = ws.mark.data();
  uint32_t* __restrict__ rank_base = ws.rank_base.data();
  int32_t* __restrict__ slot_of_rank = ws.slot_of_rank.data();
  uint64_t* __restrict__ hits = ws.hits.data();
  const uint32_t umax = static_cast<uint32_t>(max_tokens);

  // 1. Mark this step's top-k set and rank its distinct tokens.
  uint32_t last_word = 0;
  for (int32_t p = 0; p < k; ++p) {
    const uint32_t t = static_cast<uint32_t>(topk[p]);
    if (t < umax) {
      mark[t >> 6] |= uint64_t{1} << (t & 63);
      last_word = std::max(last_word, t >> 6);
    }
  }
  uint32_t distinct = 0;
  for (uint32_t w = 0; w <= last_word; ++w) {
    rank_base[w] = distinct;
    distinct += static_cast<uint32_t>(__builtin_popcountll(mark[w]));
  }
  std::fill(slot_of_rank, slot_of_rank + distinct, -1);
  auto rank = [&](uint32_t t) {
    const uint64_t below = (uint64_t{1} << (t & 63)) - 1;
    return rank_base[t >> 6] + static_cast<uint32_t>(__builtin_popcountll(mark[t >> 6] & below));
  };

  // 2. Walk the LRU order (oldest first): drop speculative tokens (at or past the stable
  //    prefix), pack evictables in place at the front and copy hits aside, both in LRU order.
  int32_t n_hit = 0, n_evict = 0;
  for (int32_t i = 0; i < capacity; ++i) {
    const uint64_t e = lru[i];
    const int32_t t = entry_token(e);
    // Empty (-1) or speculative (>= stable, which is >= 0): unsigned compare catches both.
    const bool gone = static_cast<uint32_t>(t) >= static_cast<uint32_t>(stable);
    const uint32_t ti = gone ? umax : static_cast<uint32_t>(t);  // bit umax is never set
    const int32_t hit = static_cast<int32_t>((mark[ti >> 6] >> (ti & 63)) & 1);
    const uint64_t e2 = gone ? (e | 0xFFFFFFFF00000000ull) : e;
    hits[n_hit] = e2;
    lru[n_evict] = e2;  // n_evict <= i: never overwrites an entry not yet read
    n_hit += hit;
    n_evict += 1 - hit;
  }
  for (int32_t j = 0; j < n_hit; ++j) {
    slot_of_rank[rank(static_cast<uint32_t>(entry_token(hits[j])))] = entry_slot(hits[j]);
  }

  // 3. Resolve every top-k position; a token's first miss takes the oldest evictable slot and
  //    later duplicates reuse it. Misses never outnumber evictables since capacity >= topk.
  int32_t m = 0;
  for (int32_t p = 0; p < k; ++p) {
    const int32_t t = topk[p];
    if (static_cast<uint32_t>(t) >= umax) {
      out.current_slots[p] = -1;
      continue;
    }
    const uint32_t r = rank(static_cast<uint32_t>(t));
    const int32_t have = slot_of_rank[r];
    const int32_t miss = have < 0;
    const int32_t s = miss ? entry_slot(lru[m]) : have;  // lru[m] is readable even at m == n_evict
    slot_of_rank[r] = s;
    out.miss_tokens[m] = t;
    out.miss_slots[m] = s;
    m += miss;
    out.current_slots[p] = s;
  }
  std::fill(out.miss_tokens + m, out.miss_tokens + k, -1);
  std::fill(out.miss_slots + m, out.miss_slots + k, -1);
  *out.miss_count = m;

  // 4. New LRU order: unused evictables (old order), filled misses, hits (old order).
  std::memmove(lru, lru + m, sizeof(uint64_t) * static_cast<size_t>(n_evict - m));
  uint64_t* filled = lru + (n_evict - m);
  for (int32_t j = 0; j < m; ++j) filled[j] = pack(out.miss_tokens[j], out.miss_slots[j]);
  std::memcpy(lru + n_evict, hits, sizeof(uint64_t) * static_cast<size_t>(n_hit));

  // 5. Leave the bitmap all-zero for the next row.
  std::memset(mark, 0, sizeof(uint64_t) * (static_cast<size_t>(last_word) + 1));
}

struct DescriptorArgs {
  const int32_t* miss_tokens;
  const int32_t* miss_slots;
  const int32_t* miss_count;
  int64_t rows;
  int64_t k;
  int64_t block_size;
  int64_t blocks_per_row;
  uint64_t src_base_k, src_base_v, dst_base_k, dst_base_v;
  uint64_t token_bytes_k, token_bytes_v;
  int64_t capacity;
};

// Fills K descriptors at [start[r], ...) and V descriptors at [total + start[r], ...) where
// start is the prefix sum of the clamped miss counts; returns per-row valid counts in `valid`.
// Invalid entries are skipped, so a row's valid entries are packed at the front of its range.
template <typename BlockT>
void descriptors_impl(const DescriptorArgs& a, const BlockT* __restrict__ block_table,
                      const int64_t* __restrict__ start, int64_t total, uint64_t* __restrict__ src,
                      uint64_t* __restrict__ dst, int64_t* __restrict__ valid, int num_threads) {
  const uint64_t bs = static_cast<uint64_t>(a.block_size);
#pragma omp parallel for num_threads(num_threads) schedule(static) if (num_threads > 1)
  for (int64_t r = 0; r < a.rows; ++r) {
    const int64_t n = std::min<int64_t>(std::max<int32_t>(a.miss_count[r], 0), a.k);
    const int32_t* toks = a.miss_tokens + r * a.k;
    const int32_t* slots = a.miss_slots + r * a.k;
    const BlockT* bt = block_table + r * a.blocks_per_row;
    uint64_t* src_k = src + start[r];
    uint64_t* dst_k = dst + start[r];
    uint64_t* src_v = src + total + start[r];
    uint64_t* dst_v = dst + total + start[r];
    const uint64_t row_slot0 = static_cast<uint64_t>(r) * static_cast<uint64_t>(a.capacity);
    int64_t j = 0;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t t = toks[i];
      const int64_t s = slots[i];
      if (t < 0 || s < 0 || s >= a.capacity) continue;
      const int64_t b = t / a.block_size;
      if (b >= a.blocks_per_row) continue;
      const int64_t blk = static_cast<int64_t>(bt[b]);
      if (blk < 0) continue;
      // All address math in uint64: block ids past 2^14 and bases past 2^32 are normal here.
      const uint64_t src_tok = static_cast<uint64_t>(blk) * bs + static_cast<uint64_t>(t % a.block_size);
      const uint64_t dst_tok = row_slot0 + static_cast<uint64_t>(s);
      src_k[j] = a.src_base_k + src_tok * a.token_bytes_k;
      dst_k[j] = a.dst_base_k + dst_tok * a.token_bytes_k;
      src_v[j] = a.src_base_v + src_tok * a.token_bytes_v;
      dst_v[j] = a.dst_base_v + dst_tok * a.token_bytes_v;
      ++j;
    }
    valid[r] = j;
  }
}

// ======  Binding-boundary validation  ======

[[noreturn]] void fail(const std::string& msg) { throw py::value_error(msg); }

std::string shape_str(const py::array& a) {
  std::string s = "(";
  for (py::ssize_t i = 0; i < a.ndim(); ++i) {
    if (i) s += ", ";
    s += std::to_string(a.shape(i));
  }
  if (a.ndim() == 1) s += ",";
  return s + ")";
}

std::string dtype_str(const py::array& a) { return py::str(a.dtype()).cast<std::string>(); }

// Returns `obj` as an array without copying; rejects wrong type, dtype, rank or layout.
template <typename T>
py::array checked_array(const py::handle& obj, const char* name, py::ssize_t ndim,
                        const char* dtype_name) {
  if (!py::isinstance<py::array>(obj)) {
    fail(std::string(name) + " must be a numpy.ndarray of dtype " + dtype_name + ", got " +
         py::str(py::type::handle_of(obj).attr("__name__")).cast<std::string>());
  }
  py::array a = py::reinterpret_borrow<py::array>(obj);
  if (!a.dtype().equal(py::dtype::of<T>())) {
    fail(std::string(name) + " must have dtype " + dtype_name + ", got " + dtype_str(a) +
         " (convert with .astype(numpy." + dtype_name + "))");
  }
  if (a.ndim() != ndim) {
    fail(std::string(name) + " must be " + std::to_string(ndim) + "-D, got shape " +
         shape_str(a));
  }
  if (!(a.flags() & py::array::c_style)) {
    fail(std::string(name) + " must be C-contiguous (use numpy.ascontiguousarray)");
  }
  return a;
}

uint64_t checked_u64(const py::handle& obj, const char* name) {
  if (!PyLong_Check(obj.ptr()) && !PyIndex_Check(obj.ptr())) {
    fail(std::string(name) + " must be an integer, got " +
         py::str(py::type::handle_of(obj).attr("__name__")).cast<std::string>());
  }
  py::int_ v = py::reinterpret_steal<py::int_>(PyNumber_Index(obj.ptr()));
  if (!v) throw py::error_already_set();
  if (PyObject_RichCompareBool(v.ptr(), py::int_(0).ptr(), Py_LT) == 1) {
    fail(std::string(name) + " must be >= 0, got " + py::str(v).cast<std::string>());
  }
  const unsigned long long u = PyLong_AsUnsignedLongLong(v.ptr());
  if (u == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
    PyErr_Clear();
    fail(std::string(name) + " must be < 2**64, got " + py::str(v).cast<std::string>());
  }
  return static_cast<uint64_t>(u);
}

using kvpd_native::int_in;

constexpr int64_t kI32Max = 2147483647;

// ======  Python-facing planner  ======

class SparseLRUPlanner {
 public:
  SparseLRUPlanner(const py::handle& num_layers, const py::handle& max_rows, const py::handle& topk,
                   const py::handle& capacity, const py::handle& max_model_len,
                   const py::handle& num_threads) {
    num_layers_ = int_in(num_layers, "num_layers", 1, kI32Max);
    max_rows_ = int_in(max_rows, "max_rows", 1, kI32Max);
    topk_ = int_in(topk, "topk", 1, kI32Max);
    // The dummy index max_model_len must still fit in int32.
    max_model_len_ = int_in(max_model_len, "max_model_len", 1, kI32Max - 64);
    capacity_ = int_in(capacity, "capacity", 1, kI32Max - 1);
    if (capacity_ < topk_) {
      fail("capacity (" + std::to_string(capacity_) + ") must be >= topk (" +
           std::to_string(topk_) +
           "): every top-k token needs a slot in the hot buffer; raise topk_buffer_size");
    }
    int64_t nt = int_in(num_threads, "num_threads", 0, 1024);
    num_threads_ = static_cast<int>(nt == 0 ? max_threads() : nt);
    const size_t cells = static_cast<size_t>(num_layers_ * max_rows_);
    // One spare entry past the last cell keeps plan_row_impl's lru[m] read in bounds.
    lru_.reset(new uint64_t[cells * static_cast<size_t>(capacity_) + 1]);
    lru_[cells * static_cast<size_t>(capacity_)] = 0;
    last_req_ids_.reset(new int64_t[cells]);
    reset_all();
    for (int i = 0; i < num_threads_; ++i) {
      workspaces_.emplace_back(new Workspace(max_model_len_, topk_, capacity_));
    }
  }

  py::tuple plan(const py::handle& layer_obj, const py::handle& topk_obj,
                 const py::handle& req_obj, const py::handle& stable_obj) {
    const int64_t layer = int_in(layer_obj, "layer", 0, num_layers_ - 1);
    py::array topk = checked_array<int32_t>(topk_obj, "topk_indices", 2, "int32");
    const int64_t rows = topk.shape(0);
    if (rows > max_rows_ || topk.shape(1) != topk_) {
      fail("topk_indices must have shape (rows, " + std::to_string(topk_) + ") with rows <= " +
           std::to_string(max_rows_) + ", got " + shape_str(topk));
    }
    py::array req = checked_array<int64_t>(req_obj, "req_ids", 1, "int64");
    if (req.shape(0) != rows) {
      fail("req_ids must have shape (" + std::to_string(rows) + ",) like topk_indices' rows, got " +
           shape_str(req));
    }
    py::array stable = checked_array<int32_t>(stable_obj, "stable_prefix_lens", 1, "int32");
    if (stable.shape(0) != rows) {
      fail("stable_prefix_lens must have shape (" + std::to_string(rows) +
           ",) like topk_indices' rows, got " + shape_str(stable));
    }

    const py::ssize_t k = static_cast<py::ssize_t>(topk_);
    py::array_t<int32_t> current({static_cast<py::ssize_t>(rows), k});
    py::array_t<int32_t> miss_tokens({static_cast<py::ssize_t>(rows), k});
    py::array_t<int32_t> miss_slots({static_cast<py::ssize_t>(rows), k});
    py::array_t<int32_t> miss_count(static_cast<py::ssize_t>(rows));

    const int32_t* t_ptr = static_cast<const int32_t*>(topk.data());
    const int64_t* req_ptr = static_cast<const int64_t*>(req.data());
    const int32_t* st_ptr = static_cast<const int32_t*>(stable.data());
    int32_t* cur_ptr = current.mutable_data();
    int32_t* mt_ptr = miss_tokens.mutable_data();
    int32_t* ms_ptr = miss_slots.mutable_data();
    int32_t* mc_ptr = miss_count.mutable_data();
    const int64_t cell0 = layer * max_rows_;
    const int nt = static_cast<int>(std::min<int64_t>(num_threads_, std::max<int64_t>(rows, 1)));
    {
      py::gil_scoped_release nogil;
      // The GIL is released, so serialise callers: the workspaces and state are shared.
      std::lock_guard<std::mutex> lock(mutex_);
#pragma omp parallel for num_threads(nt) schedule(dynamic, 2) if (nt > 1)
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t cell = cell0 + r;
        const RowOut out{cur_ptr + r * topk_, mt_ptr + r * topk_, ms_ptr + r * topk_, mc_ptr + r};
        plan_row_impl(t_ptr + r * topk_, static_cast<int32_t>(topk_), req_ptr[r], st_ptr[r],
                      lru_.get() + cell * capacity_, last_req_ids_.get() + cell,
                      static_cast<int32_t>(capacity_),
                      static_cast<int32_t>(max_model_len_), *workspaces_[thread_id()], out);
      }
    }
    return py::make_tuple(current, miss_tokens, miss_slots, miss_count);
  }

  void reset() {
    py::gil_scoped_release nogil;
    std::lock_guard<std::mutex> lock(mutex_);
    reset_all();
  }

  void reset_all() {
    const size_t cells = static_cast<size_t>(num_layers_ * max_rows_);
    for (size_t c = 0; c < cells; ++c) {
      reset_cell(lru_.get() + c * capacity_, static_cast<int32_t>(capacity_));
      last_req_ids_[c] = -1;
    }
  }

  int64_t num_layers() const { return num_layers_; }
  int64_t max_rows() const { return max_rows_; }
  int64_t topk() const { return topk_; }
  int64_t capacity() const { return capacity_; }
  int64_t max_model_len() const { return max_model_len_; }
  int num_threads() const { return num_threads_; }

 private:
  int64_t num_layers_, max_rows_, topk_, capacity_, max_model_len_;
  int num_threads_;
  std::unique_ptr<uint64_t[]> lru_;  // [num_layers * max_rows, capacity] entries, oldest first
  std::unique_ptr<int64_t[]> last_req_ids_;
  std::vector<std::unique_ptr<Workspace>> workspaces_;
  std::mutex mutex_;
};

py::tuple build_copy_descriptors(const py::handle& mt_obj, const py::handle& ms_obj,
                                 const py::handle& mc_obj, const py::handle& bt_obj,
                                 const py::handle& block_size, const py::handle& src_base_k,
                                 const py::handle& src_base_v, const py::handle& dst_base_k,
                                 const py::handle& dst_base_v, const py::handle& token_bytes_k,
                                 const py::handle& token_bytes_v, const py::handle& capacity,
                                 const py::handle& num_threads) {
  py::array mt = checked_array<int32_t>(mt_obj, "miss_tokens", 2, "int32");
  py::array ms = checked_array<int32_t>(ms_obj, "miss_slots", 2, "int32");
  if (ms.shape(0) != mt.shape(0) || ms.shape(1) != mt.shape(1)) {
    fail("miss_slots must have the shape of miss_tokens " + shape_str(mt) + ", got " +
         shape_str(ms));
  }
  const int64_t rows = mt.shape(0);
  py::array mc = checked_array<int32_t>(mc_obj, "miss_count", 1, "int32");
  if (mc.shape(0) != rows) {
    fail("miss_count must have shape (" + std::to_string(rows) + ",) like miss_tokens' rows, got " +
         shape_str(mc));
  }
  if (!py::isinstance<py::array>(bt_obj)) {
    fail("block_table must be a numpy.ndarray of dtype int32 or int64");
  }
  py::array bt_any = py::reinterpret_borrow<py::array>(bt_obj);
  const bool bt64 = bt_any.dtype().equal(py::dtype::of<int64_t>());
  py::array bt = bt64 ? checked_array<int64_t>(bt_obj, "block_table", 2, "int64")
                      : checked_array<int32_t>(bt_obj, "block_table", 2, "int32");
  if (bt.shape(0) < rows) {
    fail("block_table must have at least " + std::to_string(rows) +
         " rows (one per miss_tokens row), got shape " + shape_str(bt));
  }
  DescriptorArgs a{};
  a.miss_tokens = static_cast<const int32_t*>(mt.data());
  a.miss_slots = static_cast<const int32_t*>(ms.data());
  a.miss_count = static_cast<const int32_t*>(mc.data());
  a.rows = rows;
  a.k = mt.shape(1);
  a.block_size = int_in(block_size, "block_size", 1, kI32Max);
  a.blocks_per_row = bt.shape(1);
  a.src_base_k = checked_u64(src_base_k, "src_base_k");
  a.src_base_v = checked_u64(src_base_v, "src_base_v");
  a.dst_base_k = checked_u64(dst_base_k, "dst_base_k");
  a.dst_base_v = checked_u64(dst_base_v, "dst_base_v");
  a.token_bytes_k = static_cast<uint64_t>(int_in(token_bytes_k, "token_bytes_k", 1, kI32Max));
  a.token_bytes_v = static_cast<uint64_t>(int_in(token_bytes_v, "token_bytes_v", 1, kI32Max));
  a.capacity = int_in(capacity, "capacity", 1, kI32Max);
  int64_t nt = int_in(num_threads, "num_threads", 0, 1024);
  const int threads = static_cast<int>(
      std::min<int64_t>(nt == 0 ? max_threads() : nt, std::max<int64_t>(rows, 1)));

  std::vector<int64_t> start(static_cast<size_t>(rows) + 1, 0);
  for (int64_t r = 0; r < rows; ++r) {
    start[r + 1] = start[r] + std::min<int64_t>(std::max<int32_t>(a.miss_count[r], 0), a.k);
  }
  const int64_t total = start[rows];
  py::array_t<uint64_t> src(static_cast<py::ssize_t>(2 * total));
  py::array_t<uint64_t> dst(static_cast<py::ssize_t>(2 * total));
  std::vector<int64_t> valid(static_cast<size_t>(rows), 0);
  uint64_t* src_p = src.mutable_data();
  uint64_t* dst_p = dst.mutable_data();
  int64_t n_valid = 0;
  {
    py::gil_scoped_release nogil;
    if (bt64) {
      descriptors_impl(a, static_cast<const int64_t*>(bt.data()), start.data(), total, src_p,
                       dst_p, valid.data(), threads);
    } else {
      descriptors_impl(a, static_cast<const int32_t*>(bt.data()), start.data(), total, src_p,
                       dst_p, valid.data(), threads);
    }
    for (int64_t r = 0; r < rows; ++r) n_valid += valid[r];
    if (n_valid != total) {
      // Rare: pack the valid prefix of every row's K then V range to the front.
      int64_t w = 0;
      for (int half = 0; half < 2; ++half) {
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t from = half * total + start[r];
          std::memmove(src_p + w, src_p + from, sizeof(uint64_t) * valid[r]);
          std::memmove(dst_p + w, dst_p + from, sizeof(uint64_t) * valid[r]);
          w += valid[r];
        }
      }
    }
  }
  py::array_t<uint64_t> sizes(static_cast<py::ssize_t>(2 * n_valid));
  uint64_t* sz = sizes.mutable_data();
  std::fill(sz, sz + n_valid, a.token_bytes_k);
  std::fill(sz + n_valid, sz + 2 * n_valid, a.token_bytes_v);
  if (n_valid != total) {
    py::slice keep(0, static_cast<py::ssize_t>(2 * n_valid), 1);
    return py::make_tuple(src[keep], dst[keep], sizes);
  }
  return py::make_tuple(src, dst, sizes);
}

py::dict build_info() {
  py::dict d;
#if defined(__clang__)
  d["compiler"] = std::string("clang ") + __clang_version__;
#elif defined(__GNUC__)
  d["compiler"] = std::string("gcc ") + __VERSION__;
#else
  d["compiler"] = std::string("unknown");
#endif
#ifdef _OPENMP
  d["openmp"] = static_cast<long>(_OPENMP);
#else
  d["openmp"] = py::none();
#endif
  d["isa_flags"] = std::string(KVPD_ISA_FLAGS);
  std::string feats;
#if defined(__AVX512F__)
  feats += "avx512f ";
#endif
#if defined(__AVX2__)
  feats += "avx2 ";
#endif
#if defined(__SSE4_2__)
  feats += "sse4.2 ";
#endif
#if defined(__ARM_NEON)
  feats += "neon ";
#endif
#if defined(__ARM_FEATURE_SVE)
  feats += "sve ";
#endif
  if (!feats.empty()) feats.pop_back();
  d["isa_features"] = feats;
  d["max_threads"] = max_threads();
  return d;
}

}  // namespace

PYBIND11_MODULE(_sparse_lru, m) {
  m.doc() = "kvpd native core: sparse-KV hot-buffer LRU planner and copy descriptors.";
  py::class_<SparseLRUPlanner>(m, "SparseLRUPlanner")
      .def(py::init<const py::handle&, const py::handle&, const py::handle&, const py::handle&,
                    const py::handle&, const py::handle&>(),
           py::arg("num_layers"), py::arg("max_rows"), py::arg("topk"), py::arg("capacity"),
           py::arg("max_model_len"), py::arg("num_threads") = 0)
      .def("plan", &SparseLRUPlanner::plan, py::arg("layer"), py::arg("topk_indices"),
           py::arg("req_ids"), py::arg("stable_prefix_lens"),
           "Map one layer's top-k token positions to hot-buffer slots; returns (current_slots, "
           "miss_tokens, miss_slots, miss_count).")
      .def("reset", &SparseLRUPlanner::reset, "Forget every layer's and row's residency.")
      .def_property_readonly("num_layers", &SparseLRUPlanner::num_layers)
      .def_property_readonly("max_rows", &SparseLRUPlanner::max_rows)
      .def_property_readonly("topk", &SparseLRUPlanner::topk)
      .def_property_readonly("capacity", &SparseLRUPlanner::capacity)
      .def_property_readonly("max_model_len", &SparseLRUPlanner::max_model_len)
      .def_property_readonly("num_threads", &SparseLRUPlanner::num_threads);
  m.def("build_copy_descriptors", &build_copy_descriptors, py::arg("miss_tokens"),
        py::arg("miss_slots"), py::arg("miss_count"), py::arg("block_table"),
        py::arg("block_size"), py::arg("src_base_k"), py::arg("src_base_v"),
        py::arg("dst_base_k"), py::arg("dst_base_v"), py::arg("token_bytes_k"),
        py::arg("token_bytes_v"), py::arg("capacity"), py::arg("num_threads") = 0,
        "Host->device copy descriptors (src, dst, sizes; uint64) for the planned misses: K "
        "entries of all rows, then V; invalid entries are left out.");
  m.def("build_info", &build_info, "Compiler, OpenMP version, ISA flags and max threads.");
}
