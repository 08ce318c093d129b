// SPDX-License-Identifier: Apache-2.0
// kvpd native core behind vLLM-Ascend's sparse-offload planner interface (`sparse_kv_offload_cpp`):
// lru_resident_compact over raw addresses of caller-owned state, and the copy descriptors of its
// misses written in place. Built as kvpd.native._ascend_planner; no libtorch, no NPU headers.
//
// Semantics follow the upstream description (docs: README "Native planner"), with three choices:
// - descriptor addresses are computed in 64 bits (upstream multiplies block id by block bytes in
//   int32 and wraps for block ids >= 2^31 / (block_size * token_bytes));
// - descriptors of invalid misses are packed out (upstream leaves their address slots stale while
//   counting them in num);
// - a token repeated in one top-k row takes one slot, shared by all its positions (upstream loads
//   it into a slot per occurrence); attention reads the same K/V either way.
//
// Speed: one row is planned by a function chosen once at load time from the CPU's features
// (AVX2 where the CPU has it, also on AVX-512 CPUs (see kPreferred); NEON on aarch64, SVE when
// named; baseline),
// so one portable wheel runs the best path the host has. Threads are min(rows, workspace_threads, requested_threads) as upstream, also capped
// by the processors this process may use; the rows go to the caller and to helper threads that
// join when the OS runs them (ascend_planner_pool.hpp), not to an OpenMP team. Results do not
// depend on threads. Unlike upstream, the GIL is released while planning (the arguments are
// plain integers; each layer's state is the caller's).

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KVPD_X86 1
#endif

#if defined(__aarch64__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#define KVPD_ARM64 1
#endif

#include "ascend_planner_pool.hpp"
#include "ascend_planner_args.hpp"
#include "ascend_planner_row.hpp"
#include "ascend_planner_row64.hpp"

namespace py = pybind11;

namespace kvpd_ascend {

// ======  Per-ISA row planners  ======

void plan_row_baseline(const RowIO& io, Workspace& ws) { plan_row_generic(io, ws); }

#ifdef KVPD_X86
__attribute__((target("avx2,bmi,bmi2,popcnt,lzcnt,fma"))) void plan_row_avx2(const RowIO& io,
                                                                              Workspace& ws) {
  plan_row_generic(io, ws);
}
void plan_row_avx512(const RowIO& io, Workspace& ws);          // ascend_planner_avx512.cpp
void plan_row_avx512_vpopcnt(const RowIO& io, Workspace& ws);  // ditto, with VPOPCNTD
#endif
#ifdef KVPD_ARM64
void plan_row_neon(const RowIO& io, Workspace& ws);  // ascend_planner_neon.cpp
void plan_row_sve(const RowIO& io, Workspace& ws);   // ditto, compiled with SVE
#endif

using RowFn = void (*)(const RowIO&, Workspace&);

struct Isa {
  const char* name;
  RowFn fn;
  bool avx2;  // the descriptor pass runs AVX2 (AVX2 or AVX-512 rows, and the CPU has AVX2)
};

// Row planners by the instructions they need, widest first: KVPD_NATIVE_ISA=<name> and
// set_isa refer to this order.
constexpr const char* kIsas[] = {"avx512_vpopcnt", "avx512", "avx2", "sve", "neon", "baseline"};

// The load-time choice, fastest first. AVX2 comes before both AVX-512 paths: those vectorise
// the previous row algorithm (16-lane walk and resolve), and the current one (branch-free
// resolve, the shorter walk, the next row fetched ahead) compiled for AVX2 does less work per
// row. Measured side by side (benchmarks/ascend_planner.py --all-isas, Sapphire Rapids class,
// 1 thread, 8 runs): AVX-512 without VPOPCNTD slower than AVX2 in every run (0.763 vs 0.637 ms
// per layer in a quiet one; its nibble-table popcount costs ~8 vector operations per rank),
// AVX-512 with VPOPCNTD slower in 6 (0.665 ms there) and 2-3% faster in 2. Every AVX-512 CPU has AVX2, so the AVX-512
// paths run only when named; they stay for comparisons and for a future port of the algorithm.
// NEON comes before SVE: the SVE build is exact (checked under qemu) but has never been timed
// (Kunpeng 920 has no SVE, and emulation gives no figures), so it runs only when named.
constexpr const char* kPreferred[] = {"avx2", "avx512_vpopcnt", "avx512", "neon", "sve",
                                      "baseline"};

bool cpu_has(const std::string& isa) {
#ifdef KVPD_X86
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                      __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("popcnt") &&
                      __builtin_cpu_supports("bmi2");
  if (isa == "avx512_vpopcnt") return avx512 && __builtin_cpu_supports("avx512vpopcntdq");
  if (isa == "avx512") return avx512;
  if (isa == "avx2") {
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi2") &&
           __builtin_cpu_supports("popcnt") && __builtin_cpu_supports("fma");
  }
#endif
#ifdef KVPD_ARM64
  if (isa == "neon") return (getauxval(AT_HWCAP) & HWCAP_ASIMD) != 0;
  if (isa == "sve") return (getauxval(AT_HWCAP) & HWCAP_SVE) != 0;
#endif
  return isa == "baseline";
}

Isa isa_named(const std::string& name) {
#ifdef KVPD_X86
  const bool avx2 = cpu_has("avx2");  // every AVX-512 CPU has it; checked all the same
  if (name == "avx512_vpopcnt") return {"avx512_vpopcnt", plan_row_avx512_vpopcnt, avx2};
  if (name == "avx512") return {"avx512", plan_row_avx512, avx2};
  if (name == "avx2") return {"avx2", plan_row_avx2, avx2};
#endif
#ifdef KVPD_ARM64
  if (name == "neon") return {"neon", plan_row_neon, false};
  if (name == "sve") return {"sve", plan_row_sve, false};
#endif
  (void)name;
  return {"baseline", plan_row_baseline, false};
}

// The row planner to use among `available` (names the CPU has): with no `cap`, the first of
// kPreferred; with one, the named path if it is available (comparisons and tests ask for a
// specific path), else the first of kPreferred below it in kIsas (an unknown name leaves only the
// baseline). A pure function of its arguments, so the choice is testable for CPUs this is not.
size_t isa_rank(const char* name) {  // index in kIsas; past the end for an unknown name
  size_t i = 0;
  while (i < std::size(kIsas) && std::strcmp(kIsas[i], name) != 0) ++i;
  return i;
}

std::string isa_choice(const std::vector<std::string>& available, const char* cap) {
  auto has = [&](const char* n) {
    return std::find(available.begin(), available.end(), n) != available.end();
  };
  if (cap != nullptr && has(cap)) return cap;
  // The widest path allowed: all without a cap, below it with one, the baseline if unknown.
  const size_t widest = cap == nullptr ? 0 : std::min(isa_rank(cap), std::size(kIsas) - 1);
  for (const char* name : kPreferred) {
    if (isa_rank(name) >= widest && has(name)) return name;
  }
  return "baseline";
}

std::vector<std::string> cpu_isas() {
  std::vector<std::string> out;
  for (const char* name : kIsas) {
    if (cpu_has(name)) out.emplace_back(name);
  }
  return out;
}

// Best path this CPU runs; KVPD_NATIVE_ISA=<name> asks for that path (see isa_choice).
Isa choose_isa() { return isa_named(isa_choice(cpu_isas(), std::getenv("KVPD_NATIVE_ISA"))); }

Isa g_isa = choose_isa();

// ======  Thread count and workspaces  ======

int usable_threads(int64_t rows, int64_t workspace_threads, int64_t requested_threads) {
  // Upstream: min(rows, workspace_threads, requested_threads) with <= 0 meaning "no limit".
  // Also capped by the processors this process may use: more threads only add waiting.
  if (rows <= 1) return 1;
  int64_t n = rows;
  if (workspace_threads > 0) n = std::min(n, workspace_threads);
  if (requested_threads > 0) n = std::min(n, requested_threads);
#ifdef _OPENMP
  static const int procs = omp_get_num_procs();  // a syscall each time otherwise
#else
  static const int procs = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
#endif
  n = std::min<int64_t>(n, procs);
  return static_cast<int>(std::max<int64_t>(n, 1));
}

Workspace& thread_workspace(int64_t max_token, int64_t topk, int64_t capacity) {
  // Owned per OS thread (OpenMP reuses its pool, so this is allocated once per thread).
  thread_local Workspace ws;
  ws.fit(max_token, topk, capacity);
  return ws;
}

// ======  lru_resident_compact  ======

void lru_resident_compact(uintptr_t req_ids, uintptr_t last_req_ids, uintptr_t topk,
                          uintptr_t stable_prefix_lens, uintptr_t slot_to_token,
                          uintptr_t lru_slots, uintptr_t current_slots, uintptr_t miss_count,
                          uintptr_t miss_tokens, uintptr_t miss_slots, uintptr_t token_mark,
                          uintptr_t token_pos, uintptr_t slot_ws, uintptr_t miss_pos,
                          uintptr_t epochs, int64_t num_reqs, int64_t topk_len, int64_t capacity,
                          int64_t max_token, int64_t workspace_threads,
                          int64_t requested_threads) {
  // The upstream workspaces (token_mark .. epochs) are accepted for the interface and left
  // untouched: kvpd's per-thread scratch is a bitmap that stays in L1 instead.
  (void)token_mark, (void)token_pos, (void)slot_ws, (void)miss_pos, (void)epochs;
  if (num_reqs <= 0 || topk_len <= 0 || capacity <= 0 || max_token <= 0) return;
  if (topk_len > INT32_MAX || capacity > INT32_MAX || max_token > INT32_MAX) return;
  const auto* req = reinterpret_cast<const int64_t*>(req_ids);
  auto* last = reinterpret_cast<int64_t*>(last_req_ids);
  const auto* tk = reinterpret_cast<const int32_t*>(topk);
  const auto* stable = reinterpret_cast<const int32_t*>(stable_prefix_lens);
  auto* stt = reinterpret_cast<int32_t*>(slot_to_token);
  auto* lru = reinterpret_cast<int32_t*>(lru_slots);
  auto* cur = reinterpret_cast<int32_t*>(current_slots);
  auto* mc = reinterpret_cast<int32_t*>(miss_count);
  auto* mt = reinterpret_cast<int32_t*>(miss_tokens);
  auto* ms = reinterpret_cast<int32_t*>(miss_slots);
  const int threads = usable_threads(num_reqs, workspace_threads, requested_threads);
  const RowFn fn = g_isa.fn;
  const int32_t k = static_cast<int32_t>(topk_len), c = static_cast<int32_t>(capacity);
  const LayerIO layer{tk, req, stable, last, stt, lru, cur, mt, ms, mc, k, c,
                      static_cast<int32_t>(max_token)};
  auto rows = [&](int64_t begin, int64_t end, int64_t after) {
    Workspace& ws = thread_workspace(max_token, topk_len, capacity);
    for (int64_t r = begin; r < end; ++r) {
      fn(layer.row(r, r + 1 < end ? r + 1 : after), ws);  // next: the row this thread plans next
    }
  };
  py::gil_scoped_release nogil;
  // Rows ~10 us of work each: on 2 threads claimed one at a time from the two ends, on more in
  // guided claims down to single rows (ascend_planner_pool.hpp), so that every row (or most)
  // finds its state fetched ahead, the threads finish within a row of each other, and a
  // preempted helper delays the caller by at most its claim.
  parallel_rows(threads, num_reqs, 1, rows);
}

// ======  compute_lru_resident_addrs over raw pointers (checked in ascend_planner_args.cpp)  ======

// One call's constants: what every row's descriptors are computed from.
struct AddrConsts {
  uint64_t bs, tok_k, tok_v, src_k, src_v, dst_k, dst_v;
  uint32_t bs32;
  int shift;  // log2 of the block size when it is a power of two, else -1
  int64_t blocks_per_row, capacity;
  uint32_t shift_k, shift_v;  // log2 of tok_k and tok_v (used when both are powers of two)
};

// One row's misses: tokens and slots, their number, the row's block table and first slot.
template <typename BlockT>
struct AddrRow {
  const int32_t* toks;
  const int32_t* slots;
  int64_t n;
  const BlockT* bt;
  uint64_t slot0;
};

// v * bytes, as a shift when kShift (bytes == 1 << shift).
template <bool kShift>
KVPD_INLINE uint64_t scaled(uint64_t v, uint64_t bytes, uint32_t shift) {
  if constexpr (kShift) {
    return v << shift;
  } else {
    (void)shift;
    return v * bytes;
  }
}

// Entry i's four addresses from its source token and its slot.
template <bool kShift>
KVPD_INLINE void put_addrs(int64_t i, uint64_t src, uint64_t us, const AddrConsts& k,
                           uint64_t dst_k, uint64_t dst_v, uint64_t* __restrict__ gk,
                           uint64_t* __restrict__ gv, uint64_t* __restrict__ ak,
                           uint64_t* __restrict__ av) {
  gk[i] = k.src_k + scaled<kShift>(src, k.tok_k, k.shift_k);
  gv[i] = k.src_v + scaled<kShift>(src, k.tok_v, k.shift_v);
  ak[i] = dst_k + scaled<kShift>(us, k.tok_k, k.shift_k);
  av[i] = dst_v + scaled<kShift>(us, k.tok_v, k.shift_v);
}

// One row's descriptors, written packed from the row's start; returns how many were valid.
// Taken by value and through __restrict__ locals: reached through the closure's references,
// every constant was reloaded from memory for each entry (the stores through uint64_t* might
// alias them in the compiler's eyes).
template <typename BlockT>
KVPD_INLINE int64_t addrs_row_checked(const AddrRow<BlockT> row, const AddrConsts k,
                                      uint64_t* __restrict__ gk, uint64_t* __restrict__ gv,
                                      uint64_t* __restrict__ ak, uint64_t* __restrict__ av) {
  const int32_t* __restrict__ toks = row.toks;
  const int32_t* __restrict__ slots = row.slots;
  const BlockT* __restrict__ row_bt = row.bt;
  const int64_t n = row.n;
  const uint64_t slot0 = row.slot0;
  const uint64_t dst_k = k.dst_k + slot0 * k.tok_k, dst_v = k.dst_v + slot0 * k.tok_v;
  const uint64_t ucap = static_cast<uint64_t>(k.capacity);
  const uint64_t ublocks = static_cast<uint64_t>(k.blocks_per_row);
  int64_t j = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t t = toks[i], s = slots[i];
    if (t < 0 || static_cast<uint32_t>(s) >= ucap) continue;  // s < 0 wraps past capacity
    // One 32-bit division (a shift for the usual power-of-two block size), not two 64-bit.
    const uint32_t ut = static_cast<uint32_t>(t);
    const uint32_t q = k.shift >= 0 ? ut >> k.shift : ut / k.bs32;
    if (q >= ublocks) continue;
    const int64_t blk = static_cast<int64_t>(row_bt[q]);
    if (blk < 0) continue;
    // All in uint64: block ids past 2^14 and bases near 2^50 are normal here.
    const uint64_t src_tok = static_cast<uint64_t>(blk) * k.bs + (ut - q * k.bs32);
    put_addrs<false>(j, src_tok, static_cast<uint32_t>(s), k, dst_k, dst_v, gk, gv, ak, av);
    ++j;
  }
  return j;
}

// The same on the assumption that every entry is valid (the manager's inputs), in two passes
// with no branch per entry: the first finds each entry's source token (the block table read,
// the range checks folded into one flag; an index past the table is clamped, so nothing outside
// it is read) and keeps it in gk; the second, which the compiler vectorises, computes the four
// addresses. When the block size and both token sizes are powers of two (block 128, bf16 MLA:
// 1024 and 128 bytes) both passes use shifts, no multiplies (a 64-bit product is three
// multiplies in AVX2 lanes).
// One pass holding every constant needs more registers than x86-64 has (it spilled, ~55
// instructions an entry). Measured on Zen 5, 64 rows with 15,744 misses: 28 us a call against
// 36 us for the single checked pass of before. Returns -1 for a flagged row, which the caller
// redoes with addrs_row_checked.
template <bool kShift, typename BlockT>
KVPD_INLINE int64_t addrs_row_unchecked(const AddrRow<BlockT> row, const AddrConsts k,
                                        uint64_t* __restrict__ gk, uint64_t* __restrict__ gv,
                                        uint64_t* __restrict__ ak, uint64_t* __restrict__ av) {
  const int32_t* slots = row.slots;  // read by both passes
  const int64_t n = row.n;
  const uint32_t ucap = static_cast<uint32_t>(k.capacity);
  const uint64_t ublocks = static_cast<uint64_t>(k.blocks_per_row);
  uint64_t bad = 0;
  const uint32_t block_shift = static_cast<uint32_t>(k.shift), in_block = k.bs32 - 1;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t ut = static_cast<uint32_t>(row.toks[i]);
    uint32_t q;
    if constexpr (kShift) {
      q = ut >> block_shift;
    } else {
      q = k.shift >= 0 ? ut >> k.shift : ut / k.bs32;
    }
    const uint64_t in_range = uint64_t{q} < ublocks;
    const int64_t blk = static_cast<int64_t>(row.bt[q & (0u - static_cast<uint32_t>(in_range))]);
    const uint64_t bad_slot = static_cast<uint32_t>(slots[i]) >= ucap;  // also s < 0
    bad |= (in_range ^ 1) | (ut >> 31) | bad_slot | (static_cast<uint64_t>(blk) >> 63);
    if constexpr (kShift) {
      gk[i] = (static_cast<uint64_t>(blk) << block_shift) | (ut & in_block);
    } else {
      gk[i] = static_cast<uint64_t>(blk) * k.bs + (ut - q * k.bs32);
    }
  }
  if (bad) return -1;
  const uint64_t dst_k = k.dst_k + row.slot0 * k.tok_k, dst_v = k.dst_v + row.slot0 * k.tok_v;
  for (int64_t i = 0; i < n; ++i) {
    put_addrs<kShift>(i, gk[i], static_cast<uint32_t>(slots[i]), k, dst_k, dst_v, gk, gv, ak, av);
  }
  return n;
}

// What every row of one descriptor call is computed from, and where its outputs go.
template <typename BlockT>
struct AddrJob {
  const int32_t* mt;
  const int32_t* ms;
  int64_t k;
  const BlockT* bt;
  int64_t blocks_per_row, capacity, total;
  const int64_t* start;  // a row's first entry (prefix sum of the clamped miss counts)
  int64_t* valid;        // out: a row's valid entries
  AddrConsts consts;
  bool pow2;  // block size and both token sizes powers of two: shifts, no multiplies
  int32_t size_k, size_v;
  uint64_t* gvas;
  uint64_t* addr;
  int32_t* size;
};

// Rows [begin, end) of a descriptor call. Inlined into one function per instruction set
// (addrs_rows_baseline, addrs_rows_avx2), so that the address pass, which the compiler
// vectorises, is as wide as the CPU the row planner was chosen for.
template <typename BlockT>
KVPD_INLINE void addrs_rows(const AddrJob<BlockT>& a, int64_t begin, int64_t end) {
  const AddrConsts& consts = a.consts;
  for (int64_t r = begin; r < end; ++r) {
    const int64_t first = a.start[r];
    uint64_t* gk = a.gvas + first;
    uint64_t* gv = a.gvas + a.total + first;
    uint64_t* ak = a.addr + first;
    uint64_t* av = a.addr + a.total + first;
    const AddrRow<BlockT> row{a.mt + r * a.k, a.ms + r * a.k, a.start[r + 1] - first,
                              a.bt + r * a.blocks_per_row,
                              static_cast<uint64_t>(r) * static_cast<uint64_t>(a.capacity)};
    int64_t j = a.pow2 ? addrs_row_unchecked<true>(row, consts, gk, gv, ak, av)
                       : addrs_row_unchecked<false>(row, consts, gk, gv, ak, av);
    if (j < 0) j = addrs_row_checked(row, consts, gk, gv, ak, av);
    a.valid[r] = j;
    // The sizes where the entries stay when every entry is valid (the manager's inputs): on
    // the row's own thread, in the same pass; otherwise rewritten after packing.
    std::fill(a.size + first, a.size + first + j, a.size_k);
    std::fill(a.size + a.total + first, a.size + a.total + first + j, a.size_v);
  }
}

template <typename BlockT>
void addrs_rows_baseline(const AddrJob<BlockT>& a, int64_t begin, int64_t end) {
  addrs_rows(a, begin, end);
}

#ifdef KVPD_X86
// AVX2: both passes four entries a vector instead of two. Measured on Zen 4 (KVM), 64 rows
// with 15,728 misses, block 128 and bf16 MLA sizes, the call alone: 31 us against 44 us for the
// baseline build of the same rows, and against 52 us before the shifts above (medians).
template <typename BlockT>
__attribute__((target("avx2,bmi,bmi2,popcnt,lzcnt,fma"))) void addrs_rows_avx2(
    const AddrJob<BlockT>& a, int64_t begin, int64_t end) {
  addrs_rows(a, begin, end);
}
#endif

// The descriptor pass for the chosen row planner's instruction set: AVX2 with the AVX2 and
// AVX-512 row planners (every AVX-512 CPU has AVX2), else the build's baseline (on aarch64
// that is NEON already: Advanced SIMD is part of ARMv8-A).
template <typename BlockT>
auto addrs_rows_fn(bool avx2) -> void (*)(const AddrJob<BlockT>&, int64_t, int64_t) {
#ifdef KVPD_X86
  if (avx2) return addrs_rows_avx2<BlockT>;
#endif
  (void)avx2;
  return addrs_rows_baseline<BlockT>;
}

template <typename BlockT>
int64_t addrs_impl(const int32_t* mc, const int32_t* mt, const int32_t* ms, int64_t rows,
                   int64_t k, const BlockT* bt, int64_t blocks_per_row, int64_t block_size,
                   uint64_t tok_k, uint64_t tok_v, uint64_t src_k, uint64_t src_v, uint64_t dst_k,
                   uint64_t dst_v, int64_t capacity, int threads, uint64_t* gvas, uint64_t* addr,
                   int32_t* size, int32_t* num) {
  // Rows start where upstream puts them (prefix sum of the clamped miss counts); a row writes
  // its valid entries packed from there, and rows are packed together afterwards only when
  // some entry was invalid (never, on the manager's inputs).
  std::vector<int64_t> start(static_cast<size_t>(rows) + 1, 0), valid(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    start[r + 1] = start[r] + std::min<int64_t>(std::max<int32_t>(mc[r], 0), k);
  }
  const int64_t total = start[rows];
  const uint32_t bs32 = static_cast<uint32_t>(block_size);  // checked <= INT32_MAX
  // block_size, tok_k and tok_v are checked >= 1.
  auto is_pow2 = [](uint64_t v) { return (v & (v - 1)) == 0; };
  auto log2 = [](uint64_t v) { return static_cast<uint32_t>(__builtin_ctzll(v)); };
  const AddrConsts consts{static_cast<uint64_t>(block_size), tok_k, tok_v, src_k, src_v, dst_k,
                          dst_v, bs32, is_pow2(bs32) ? static_cast<int>(log2(bs32)) : -1,
                          blocks_per_row, capacity, log2(tok_k), log2(tok_v)};
  const int32_t size_k = static_cast<int32_t>(tok_k), size_v = static_cast<int32_t>(tok_v);
  const bool pow2 = is_pow2(tok_k) && is_pow2(tok_v) && is_pow2(bs32);
  const AddrJob<BlockT> job{mt,    ms,       k,     bt,    blocks_per_row, capacity,
                            total, start.data(), valid.data(), consts, pow2,  size_k,
                            size_v, gvas,  addr,  size};
  const auto rows_fn = addrs_rows_fn<BlockT>(g_isa.avx2);
  auto plan = [&](int64_t begin, int64_t end, int64_t /*after*/) { rows_fn(job, begin, end); };
  // Claims of 2 rows (~1 us each): the two threads finish within ~1 us of each other, where
  // claims of 8 left one waiting up to ~8 us of a ~40 us pass; a claim costs one CAS.
  parallel_rows(threads, rows, 2, plan);
  int64_t kept = 0;
  for (int64_t r = 0; r < rows; ++r) kept += valid[r];
  if (kept != total) {  // pack out the invalid entries: K of all rows, then V; sizes again
    int64_t w = 0;
    for (int half = 0; half < 2; ++half) {
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t from = half * total + start[r];
        std::memmove(gvas + w, gvas + from, sizeof(uint64_t) * static_cast<size_t>(valid[r]));
        std::memmove(addr + w, addr + from, sizeof(uint64_t) * static_cast<size_t>(valid[r]));
        w += valid[r];
      }
    }
    // The rows' sizes past 2 * kept stay within [0, 2 * total), which upstream fills too.
    std::fill(size, size + kept, size_k);  // K entries first
    std::fill(size + kept, size + 2 * kept, size_v);
  }
  num[0] = static_cast<int32_t>(2 * kept);
  return kept;
}

int64_t compute_addrs_raw(uintptr_t miss_count, uintptr_t miss_tokens, uintptr_t miss_slots,
                          int64_t rows, int64_t k, uintptr_t block_table, int64_t blocks_per_row,
                          bool block_table_int64, int64_t block_size, int64_t tok_k, int64_t tok_v,
                          uint64_t src_k, uint64_t src_v, uint64_t dst_k, uint64_t dst_v,
                          int64_t capacity, int64_t max_threads, uintptr_t gvas, uintptr_t addr,
                          uintptr_t size, uintptr_t num) {
  const int threads = usable_threads(rows, 0, max_threads);
  const auto* mc = reinterpret_cast<const int32_t*>(miss_count);
  const auto* mt = reinterpret_cast<const int32_t*>(miss_tokens);
  const auto* ms = reinterpret_cast<const int32_t*>(miss_slots);
  auto* g = reinterpret_cast<uint64_t*>(gvas);
  auto* a = reinterpret_cast<uint64_t*>(addr);
  auto* sz = reinterpret_cast<int32_t*>(size);
  auto* n = reinterpret_cast<int32_t*>(num);
  py::gil_scoped_release nogil;
  if (block_table_int64) {
    return addrs_impl(mc, mt, ms, rows, k, reinterpret_cast<const int64_t*>(block_table),
                      blocks_per_row, block_size, tok_k, tok_v, src_k, src_v, dst_k, dst_v,
                      capacity, threads, g, a, sz, n);
  }
  return addrs_impl(mc, mt, ms, rows, k, reinterpret_cast<const int32_t*>(block_table),
                    blocks_per_row, block_size, tok_k, tok_v, src_k, src_v, dst_k, dst_v, capacity,
                    threads, g, a, sz, n);
}

// ======  Introspection  ======

py::dict isa_info() {
  py::dict d;
  d["isa"] = g_isa.name;
  py::list avail;
  for (const std::string& name : cpu_isas()) avail.append(name);
  d["available"] = avail;
#ifdef _OPENMP
  d["openmp"] = static_cast<long>(_OPENMP);
  d["num_procs"] = omp_get_num_procs();
#else
  d["openmp"] = py::none();
  d["num_procs"] = 1;
#endif
  return d;
}

py::dict pool_stats() {
  const RowPool::Stats st = pool_slot()->stats();
  py::dict d;
  d["jobs"] = st.jobs;
  d["stalls"] = st.stalls;
  d["solo"] = st.solo;
  d["same_cpu"] = st.same_cpu;
  return d;
}

py::list pool_calls() {
  py::list out;
  for (const RowPool::Call& c : pool_slot()->take_calls()) {
    py::dict d;
    d["rows"] = c.rows;
    d["chunk"] = c.chunk;
    d["caller_rows"] = c.caller_rows;
    d["caller_ns"] = c.caller_ns;
    d["join_ns"] = c.join_ns;
    d["wait_ns"] = c.wait_ns;
    d["stalled"] = c.stalled;
    out.append(d);
  }
  return out;
}

bool set_isa(const std::string& name) {
  if (!cpu_has(name)) return false;
  g_isa = isa_named(name);
  return true;
}

}  // namespace kvpd_ascend

PYBIND11_MODULE(_ascend_planner, m) {
  using namespace kvpd_ascend;
  m.doc() = "kvpd native core behind vLLM-Ascend's sparse_kv_offload_cpp interface.";
  m.def("lru_resident_compact", &lru_resident_compact,
        "LRU residency of one layer's top-k rows over raw addresses of caller-owned state; "
        "outputs written in place.");
  bind_compute_lru_resident_addrs(m);
  m.def(
      "isa_choice",
      [](const std::vector<std::string>& available, std::optional<std::string> cap) {
        return isa_choice(available, cap ? cap->c_str() : nullptr);
      },
      py::arg("available"), py::arg("cap") = py::none(),
      "The row planner the load-time dispatch picks among `available` (path names a CPU has), "
      "with KVPD_NATIVE_ISA=`cap` if given.");
  m.def("isa_info", &isa_info, "The row planner's instruction set and what the CPU offers.");
  m.def("pool_stats", &pool_stats,
        "This process's planner threads: jobs shared with helpers, how many a preempted helper "
        "stalled, calls planned alone after a stall, and jobs a helper left because it was "
        "woken on the caller's CPU.");
  m.def("pool_calls", &pool_calls,
        "The calls shared with helpers since the last pool_calls() (the newest 256), oldest "
        "first, one dict each: rows, claim size (chunk), rows the caller planned and its time "
        "on them, how long after the call the first helper began (-1: none did), how long the "
        "caller then waited for the helpers, and whether that wait was a stall (ns).");
  m.def("set_isa", &set_isa, py::arg("name"),
        "Use the named row planner (baseline|neon|sve|avx2|avx512|avx512_vpopcnt) if the CPU has it; for "
        "tests and benchmarks. Returns whether it switched.");
}
