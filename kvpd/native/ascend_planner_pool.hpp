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
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace kvpd_ascend {

// The CPU the calling thread runs on, or -1 where the OS does not say.
inline int current_cpu() {
#if defined(__linux__)
  return sched_getcpu();
#else
  return -1;
#endif
}

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
  std::atomic<int64_t> next{0};
  std::atomic<int> joined{0};  // helpers that took part (at most `wanted`)
  // When the first helper began claiming (steady_clock ticks; 0: none did), for the pool's
  // record of the call.
  std::atomic<int64_t> first_join{0};
  int wanted = 0;
  // Two ends (threads == 2): the front in the low 32 bits, the back (one past the last row
  // still free) in the high 32 bits; the rows left are [front, back). Alone on its cache line:
  // both threads write it once a row, and sharing its line with the fields each claim reads
  // (run, ctx) sent that line between the cores once more a claim. Measured on Zen 5 (KVM), 5
  // interleaved pairs of benchmarks/ascend_planner.py: the 2-thread plan call's excess over
  // half the 1-thread call 6-14 us against 9-21 us, lower in every pair.
  alignas(64) std::atomic<uint64_t> ends{0};
  char ends_line_[64 - sizeof(std::atomic<uint64_t>)];

  void start() {
    two_ends = threads == 2 && n < (int64_t{1} << 31);
    ends.store(static_cast<uint64_t>(n) << 32, std::memory_order_relaxed);
  }

  // Plans rows until none is left; returns how many this thread planned.
  int64_t claim_all(bool from_back = false) {
    if (two_ends) return claim_ends(from_back);
    int64_t done = 0;
    int64_t b = next.load(std::memory_order_relaxed);
    for (;;) {
      if (b >= n) return done;
      const int64_t take = std::max(chunk, (n - b) / (4 * threads));
      const int64_t e = std::min(b + take, n);
      if (!next.compare_exchange_weak(b, e, std::memory_order_relaxed)) continue;  // b reloaded
      run(ctx, b, e, e < n ? e : -1);
      done += e - b;
      b = next.load(std::memory_order_relaxed);
    }
  }

 private:
  int64_t claim_ends(bool from_back) {
    int64_t done = 0;
    uint64_t cur = ends.load(std::memory_order_relaxed);
    for (;;) {
      const int64_t front = static_cast<int64_t>(cur & 0xffffffffu);
      const int64_t back = static_cast<int64_t>(cur >> 32);
      if (front >= back) return done;
      const int64_t take = std::min(chunk, back - front);
      const int64_t b = from_back ? back - take : front, e = b + take;
      const uint64_t want = from_back ? cur - (static_cast<uint64_t>(take) << 32)
                                      : cur + static_cast<uint64_t>(take);
      if (!ends.compare_exchange_weak(cur, want, std::memory_order_relaxed)) continue;
      const int64_t after = from_back ? b - 1 : e;
      run(ctx, b, e, after >= front && after < back ? after : -1);
      done += take;
      cur = ends.load(std::memory_order_relaxed);
    }
  }
};

class RowPool {
 public:
  // Runs the job on the calling thread with up to `helpers` pool threads; returns when every
  // row has run and no helper holds the job any more.
  //
  // No mutex on the way of a layer when the helpers are polling (the usual case, layer after
  // layer): the job is published and joined through atomics, and the mutex and condition
  // variables are taken only by a thread about to sleep or to wake a sleeper. A helper that
  // sees the new job while the caller still held a mutex would otherwise block on it, and the
  // caller's unlock would then have to wake it through the kernel: tens of microseconds a layer
  // on a virtual machine (an idle vCPU is woken by an interrupt), which is the whole gain of a
  // second thread on a small layer. Joining is a Dekker handshake (sequentially consistent
  // operations only): a helper counts itself in `active_` before reading `job_`; the caller
  // clears `job_` before reading `active_`, so either it sees the helper counted, or the helper
  // sees no job, and it never returns while a helper may still touch the job on its stack.
  void run(RowJob& job, int helpers) {
    if (helpers <= 0 || !call_.try_lock()) {  // busy with another caller: plan alone
      job.claim_all();
      return;
    }
    std::lock_guard<std::mutex> one_caller(call_, std::adopt_lock);
    const auto now = std::chrono::steady_clock::now();
    if (now < solo_until_) {  // a helper stalled a recent layer: plan alone for a while
      ++stats_.solo;
      job.claim_all();
      return;
    }
    start_helpers(helpers);
    job.wanted = helpers;
    caller_cpu_.store(current_cpu(), std::memory_order_relaxed);  // before the job (on_caller_cpu)
    job_.store(&job);
    gen_.fetch_add(1);
    if (sleepers_.load() > 0) {  // someone sleeps: wake it through the mutex (no lost wake-up)
      { std::lock_guard<std::mutex> lk(mu_); }
      wake_.notify_all();
    }
    const auto began = std::chrono::steady_clock::now();
    const int64_t own = job.claim_all();
    job_.store(nullptr);  // every row is claimed: a helper joining from now on finds nothing
    // A helper still planning may simply hold a long row (a new request's row takes about
    // twice a usual one): wait for it as long as two of the caller's own claims took on
    // average before taking it for preempted.
    const auto spent = std::chrono::steady_clock::now() - began;
    const std::chrono::nanoseconds claim = own > 0 ? spent / own : kJoinPoll;
    const bool stalled = wait_for_helpers(std::max(std::chrono::nanoseconds{kJoinPoll}, 2 * claim));
    record(job, own, now, spent, std::chrono::steady_clock::now() - began - spent, stalled);
    ++stats_.jobs;
    stats_.stalls += stalled ? 1 : 0;
    back_off(stalled);
  }

  // Jobs the helpers shared, how many of them stalled the caller, how many calls the caller
  // planned alone because of an earlier stall, and how many times a helper left a job because
  // it had been woken on the caller's CPU (benchmarks report them).
  struct Stats {
    uint64_t jobs = 0, stalls = 0, solo = 0, same_cpu = 0;
  };
  Stats stats() {
    std::lock_guard<std::mutex> one_caller(call_);
    Stats st = stats_;
    st.same_cpu = same_cpu_.load(std::memory_order_relaxed);
    return st;
  }

  // One shared call, as the caller saw it: where the two-thread time goes beyond half the
  // one-thread time (a helper joining late, the caller waiting for a helper's last claim, the
  // caller's own rows taking longer than alone). Nanoseconds; join_ns is -1 when no helper
  // joined.
  struct Call {
    int64_t rows, chunk, caller_rows, caller_ns, join_ns, wait_ns;
    bool stalled;
  };
  static constexpr int kRecorded = 256;
  // The shared calls since the last read (the newest kRecorded of them), oldest first.
  std::vector<Call> take_calls() {
    std::lock_guard<std::mutex> one_caller(call_);
    const uint64_t n = std::min<uint64_t>(recorded_ - read_, kRecorded);
    std::vector<Call> out;
    out.reserve(n);
    for (uint64_t i = recorded_ - n; i < recorded_; ++i) out.push_back(calls_[i % kRecorded]);
    read_ = recorded_;
    return out;
  }

 private:
  // Rows a helper took and is still planning. Poll first (it is usually finishing one right
  // now), but only for `poll` (a couple of claims' time): a helper still busy after that has
  // been preempted (its core is held by another process), and sleeping frees this core, to
  // which the kernel then moves the preempted helper (an idle core pulls runnable threads),
  // instead of the whole layer waiting for its core's scheduler slice.
  // Returns whether the helpers stalled the caller (it had to sleep for them).
  bool wait_for_helpers(std::chrono::nanoseconds poll) {
    const auto until = std::chrono::steady_clock::now() + poll;
    for (int i = 1; active_.load() != 0; ++i) {
      cpu_relax();
      if ((i & 15) == 0 && std::chrono::steady_clock::now() > until) break;
    }
    if (active_.load() == 0) return false;
    std::unique_lock<std::mutex> lk(mu_);
    caller_sleeps_.store(true);
    idle_.wait(lk, [this] { return active_.load() == 0; });
    caller_sleeps_.store(false);
    return true;
  }

  // A row cannot be taken back from a helper that is preempted while planning it (rows are
  // planned in place, in buffers the caller reuses as soon as the call returns), so on a core
  // another process holds, a layer now and then waits for that process's scheduler slice
  // (milliseconds, against ~0.4 ms of planning). After such a stall the caller plans alone for
  // a while, 1 ms at first and twice as long after each further stall (up to 128 ms), halved
  // again only by 16 calls in a row that the helpers finish on time (halving after each one
  // kept the pause near 1 ms under sustained contention, so every other layer still risked a
  // slice): under sustained contention a layer costs about the one-thread time instead of a
  // slice; when the core frees up, the helpers are back after one pause; on free cores nothing
  // changes (no stalls).
  void back_off(bool stalled) {
    if (stalled) {
      backoff_ = std::min(backoff_ == kNoBackoff ? kFirstBackoff : 2 * backoff_, kMaxBackoff);
      solo_until_ = std::chrono::steady_clock::now() + backoff_;
      on_time_ = 0;
    } else if (++on_time_ >= kOnTimeToHalve) {
      backoff_ /= 2;
      on_time_ = 0;
    }
  }

  // Under call_, after every helper has left the job (so first_join is final).
  void record(const RowJob& job, int64_t own, std::chrono::steady_clock::time_point published,
              std::chrono::nanoseconds own_time, std::chrono::nanoseconds waited, bool stalled) {
    const int64_t joined = job.first_join.load(std::memory_order_relaxed);
    const int64_t join_ns =
        joined == 0 ? -1
                    : std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::steady_clock::duration(joined) - published.time_since_epoch())
                          .count();
    calls_[recorded_++ % kRecorded] = {job.n,   job.chunk,      own,    own_time.count(),
                                       join_ns, waited.count(), stalled};
  }

  void start_helpers(int helpers) {
    while (started_ < helpers) {
      try {
        std::thread([this] { helper_loop(); }).detach();
      } catch (...) {  // no more threads: plan with those there are
        return;
      }
      ++started_;
    }
  }

  // Until a job newer than `seen` is published: poll for up to kPoll (the planner is called
  // twice per layer and layer after layer, and a sleeping helper takes tens of microseconds to
  // wake, a sizeable share of a ~0.4 ms layer), then sleep instead of spinning for milliseconds
  // on a core the engine's own threads need, as OpenMP's threads do.
  // A helper on the CPU the last caller ran on sleeps at once: polling there would take the
  // core from the caller (the Python thread between two calls, or the next call itself).
  uint64_t next_gen(uint64_t seen) {
    const bool poll = !on_caller_cpu();
    const auto until = std::chrono::steady_clock::now() + kPoll;
    for (int i = 1; poll && gen_.load() == seen; ++i) {
      cpu_relax();
      if ((i & 63) == 0 && std::chrono::steady_clock::now() > until) break;
    }
    if (gen_.load() == seen) {
      std::unique_lock<std::mutex> lk(mu_);
      sleepers_.fetch_add(1);
      wake_.wait(lk, [&] { return gen_.load() != seen; });
      sleepers_.fetch_sub(1);
    }
    return gen_.load();
  }

  // A helper woken on the caller's CPU leaves the job to the caller and sleeps. The kernel
  // places a woken thread on the waker's CPU when the helper's own CPU is busy with another
  // process (the engine's threads on a decode host): the helper then preempts the caller, the
  // two take turns on one core, and the call takes longer than the caller alone would. On a
  // 2-core Ice Lake VM with the other CPU held by a spinning process, 2-thread layers took
  // 1.07-1.33x the 1-thread time with the helper joining there, 0.88-1.01x with it leaving. The
  // helper is back once the kernel wakes it on a CPU of its own (an idle one is preferred
  // whenever there is one).
  void helper_loop() {
    for (uint64_t seen = 0;;) {
      seen = next_gen(seen);
      active_.fetch_add(1);  // counted before looking at the job (see run)
      RowJob* job = job_.load();
      if (job != nullptr && on_caller_cpu()) {
        same_cpu_.fetch_add(1, std::memory_order_relaxed);
      } else if (job != nullptr && job->joined.fetch_add(1) < job->wanted) {
        int64_t none = 0;
        job->first_join.compare_exchange_strong(
            none, std::chrono::steady_clock::now().time_since_epoch().count(),
            std::memory_order_relaxed);
        job->claim_all(/*from_back=*/true);
      }
      if (active_.fetch_sub(1) == 1 && caller_sleeps_.load()) {
        { std::lock_guard<std::mutex> lk(mu_); }
        idle_.notify_all();
      }
    }
  }

  // Whether this helper runs on the CPU the last caller published a job from (unknown: no).
  // Published before the job (job_ is stored after it), so a helper that sees a job sees its
  // caller's CPU.
  bool on_caller_cpu() const {
    const int cpu = caller_cpu_.load(std::memory_order_relaxed);
    return cpu >= 0 && current_cpu() == cpu;
  }

  static constexpr std::chrono::microseconds kPoll{100};
  // The least time to poll for a helper's last claim (rows take ~10 us; descriptor claims of
  // 2 rows ~2 us); longer when the caller's own claims took longer.
  static constexpr std::chrono::microseconds kJoinPoll{30};

  static constexpr std::chrono::microseconds kNoBackoff{0}, kFirstBackoff{1000};
  static constexpr std::chrono::microseconds kMaxBackoff{128000};

  std::mutex call_;  // one caller at a time uses the helpers; it guards the three below
  static constexpr int kOnTimeToHalve = 16;
  std::chrono::microseconds backoff_{0};
  int on_time_ = 0;  // calls in a row the helpers finished on time
  std::chrono::steady_clock::time_point solo_until_{};
  Stats stats_;
  Call calls_[kRecorded] = {};
  uint64_t recorded_ = 0, read_ = 0;  // calls recorded, and up to which take_calls read
  std::mutex mu_;    // only for sleeping and waking
  std::condition_variable wake_, idle_;
  std::atomic<RowJob*> job_{nullptr};
  std::atomic<uint64_t> gen_{0};
  std::atomic<int> active_{0};    // helpers that may be looking at job_
  std::atomic<int> sleepers_{0};  // helpers asleep or about to be, in wake_
  std::atomic<bool> caller_sleeps_{false};
  std::atomic<uint64_t> same_cpu_{0};  // jobs a helper left, woken on the caller's CPU
  std::atomic<int> caller_cpu_{-1};    // the CPU the last caller ran on (-1: unknown)
  int started_ = 0;  // under call_
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
