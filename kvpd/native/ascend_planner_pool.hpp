// SPDX-License-Identifier: Apache-2.0
// The threads of kvpd.native._ascend_planner: rows handed out a chunk at a time to the calling
// thread and to helper threads that join when they can, instead of an OpenMP team.
//
// Why not OpenMP: a parallel region ends in a barrier that waits for every thread of the team,
// including one the OS has not scheduled yet, and libgomp's threads then spin for milliseconds
// on a core. On a busy decode host (here: a shared 2-core machine) a layer then waits a
// scheduler slice for a helper that would have found no rows left (median layer 2.3 ms instead of
// 0.4 ms measured with OpenMP here). Here the caller plans rows from the start and waits only for
// rows a helper has actually taken, sleeping if that helper was preempted; a helper that wakes
// late finds no rows and goes back to sleep. Between calls helpers poll for 100 us (the next
// layer's call usually comes sooner) and then sleep, instead of spinning for milliseconds on a
// core the engine's own threads need; a second caller (another Python thread) while the pool is
// busy plans alone.
#pragma once

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

namespace kvpd_ascend {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Rows [0, n) handed out to whoever claims them first. `run(ctx, begin, end, after)` plans
// rows [begin, end); `after` is the row this thread will most likely plan next (-1: none), so
// that the row planner can fetch its state ahead.
//
// Two threads (the usual decode setting) take the rows from the two ends, `chunk` rows at a
// time (one, for the row planner): the caller from the front upwards, the helper from the back
// downwards, until they meet. Each thread's next row is then known (the row planner fetches it
// ahead for every row), and they finish within a claim of each other. More threads share one
// counter in claims that shrink as the rows run out (guided): a quarter of each thread's share
// of what is left, at least `chunk`, so that large early claims keep a thread on consecutive
// rows and small late ones leave the threads finishing together.
struct RowJob {
  void (*run)(void* ctx, int64_t begin, int64_t end, int64_t after);
  void* ctx;
  int64_t n, chunk, threads = 1;
  bool two_ends = false;  // threads == 2 (and n < 2^31, which the packing below needs)
  std::atomic<int64_t> next{0}, done{0};
  // Two ends (threads == 2): the front in the low 32 bits, the back (one past the last row
  // still free) in the high 32 bits; the rows left are [front, back).
  std::atomic<uint64_t> ends{0};

  void start() {
    two_ends = threads == 2 && n < (int64_t{1} << 31);
    ends.store(static_cast<uint64_t>(n) << 32, std::memory_order_relaxed);
  }

  void claim_all(bool from_back = false) {
    if (two_ends) {
      claim_ends(from_back);
      return;
    }
    int64_t b = next.load(std::memory_order_relaxed);
    for (;;) {
      if (b >= n) return;
      const int64_t take = std::max(chunk, (n - b) / (4 * threads));
      const int64_t e = std::min(b + take, n);
      if (!next.compare_exchange_weak(b, e, std::memory_order_relaxed)) continue;  // b reloaded
      run(ctx, b, e, e < n ? e : -1);
      done.fetch_add(e - b, std::memory_order_release);
      b = next.load(std::memory_order_relaxed);
    }
  }

 private:
  void claim_ends(bool from_back) {
    uint64_t cur = ends.load(std::memory_order_relaxed);
    for (;;) {
      const int64_t front = static_cast<int64_t>(cur & 0xffffffffu);
      const int64_t back = static_cast<int64_t>(cur >> 32);
      if (front >= back) return;
      const int64_t take = std::min(chunk, back - front);
      const int64_t b = from_back ? back - take : front, e = b + take;
      const uint64_t want = from_back ? cur - (static_cast<uint64_t>(take) << 32)
                                      : cur + static_cast<uint64_t>(take);
      if (!ends.compare_exchange_weak(cur, want, std::memory_order_relaxed)) continue;
      const int64_t after = from_back ? b - 1 : e;
      run(ctx, b, e, after >= front && after < back ? after : -1);
      done.fetch_add(take, std::memory_order_release);
      cur = ends.load(std::memory_order_relaxed);
    }
  }
};

class RowPool {
 public:
  // Runs the job on the calling thread with up to `helpers` pool threads; returns when every
  // row has run and no helper holds the job any more.
  void run(RowJob& job, int helpers) {
    if (helpers <= 0 || !call_.try_lock()) {  // busy with another caller: plan alone
      job.claim_all();
      return;
    }
    std::lock_guard<std::mutex> one_caller(call_, std::adopt_lock);
    {
      std::lock_guard<std::mutex> lk(mu_);
      start_helpers(helpers);
      job_ = &job;
      wanted_ = helpers;
      gen_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
    job.claim_all();
    // Rows a helper took and is still planning: poll (it is usually finishing one right now,
    // and a futex wake-up would cost more than the wait), then sleep until it is done, so that
    // a helper the OS preempted gets the core back.
    const auto until = std::chrono::steady_clock::now() + kPoll;
    for (int i = 1; job.done.load(std::memory_order_acquire) < job.n ||
                    active_.load(std::memory_order_acquire) != 0;
         ++i) {
      cpu_relax();
      if ((i & 63) == 0 && std::chrono::steady_clock::now() > until) break;
    }
    std::unique_lock<std::mutex> lk(mu_);
    job_ = nullptr;  // a helper waking from now on finds nothing
    idle_.wait(lk, [this] { return active_ == 0; });
  }

 private:
  void start_helpers(int helpers) {  // under mu_
    while (started_ < helpers) {
      try {
        std::thread([this] { helper_loop(); }).detach();
      } catch (...) {  // no more threads: plan with those there are
        return;
      }
      ++started_;
    }
  }

  void helper_loop() {
    uint64_t seen = 0;
    for (;;) {
      // Poll for the next job for up to kPoll before sleeping: the planner is called twice per
      // layer and layer after layer, and a sleeping helper takes tens of microseconds to wake
      // (a sizeable share of a ~0.4 ms layer). Bounded, unlike OpenMP's spinning.
      const auto until = std::chrono::steady_clock::now() + kPoll;
      for (int i = 1; gen_.load(std::memory_order_acquire) == seen; ++i) {
        cpu_relax();
        if ((i & 63) == 0 && std::chrono::steady_clock::now() > until) break;
      }
      std::unique_lock<std::mutex> lk(mu_);
      wake_.wait(lk, [&] { return gen_.load(std::memory_order_relaxed) != seen; });
      seen = gen_.load(std::memory_order_relaxed);
      if (job_ == nullptr || active_ >= wanted_) continue;
      RowJob* job = job_;
      ++active_;
      lk.unlock();
      job->claim_all(/*from_back=*/true);
      lk.lock();
      if (--active_ == 0) idle_.notify_all();
    }
  }

  static constexpr std::chrono::microseconds kPoll{100};

  std::mutex call_;  // one caller at a time uses the helpers
  std::mutex mu_;
  std::condition_variable wake_, idle_;
  RowJob* job_ = nullptr;
  std::atomic<uint64_t> gen_{0};  // changed under mu_; read without it while polling
  std::atomic<int> active_{0};  // helpers holding the job; changed under mu_
  int started_ = 0, wanted_ = 0;
};

// The process's pool. Never destroyed (helpers may sleep in it at exit); a forked child (vLLM
// forks its workers) gets a fresh one, since the parent's helper threads do not exist there.
inline RowPool*& pool_slot() {
  static RowPool* pool = [] {
    pthread_atfork(nullptr, nullptr, [] { pool_slot() = new RowPool(); });
    return new RowPool();
  }();
  return pool;
}

// f(begin, end, after) over rows [0, n) on `threads` threads (the caller and threads - 1
// helpers); `after` as in RowJob.
template <typename F>
void parallel_rows(int threads, int64_t n, int64_t chunk, F& f) {
  if (threads <= 1 || n <= chunk) {
    f(int64_t{0}, n, int64_t{-1});
    return;
  }
  RowJob job;
  job.run = [](void* ctx, int64_t b, int64_t e, int64_t after) {
    (*static_cast<F*>(ctx))(b, e, after);
  };
  job.ctx = &f;
  job.n = n;
  job.chunk = chunk;
  job.threads = threads;
  job.start();
  pool_slot()->run(job, threads - 1);
}

}  // namespace kvpd_ascend
