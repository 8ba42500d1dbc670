// The kernels' thread pool: par_for(begin, end, grain, f) with at::parallel_for's contract
// (f(chunk_begin, chunk_end) over disjoint chunks covering [begin, end), at most
// at::get_num_threads() chunks of at least `grain` items; nested calls run inline).
//
// Why not at::parallel_for: in a torch built with OpenMP it is a header-only
// `#pragma omp parallel`, and libgomp keeps one team of worker threads per calling thread
// (the engine's scheduler thread, the trainer's, the server's...). Once there are more
// managed threads than cores libgomp throttles its spin-wait to ~1,000 iterations, so the
// workers sleep between the ~20 parallel regions of one decode step and each region pays a
// futex wake-up; measured on 2 cores, a batch-16 step on 2 threads took 6.6 ms in the engine's
// thread against 3.1-3.3 ms for the same forward in a process's only team.
// Here one process-wide pool serves every caller: its workers spin for up to kSpinNs after a
// task (covering the gaps inside a forward) and then block on a futex (std::atomic::wait), so
// an idle engine costs nothing. One caller at a time: a call that finds the pool busy, or that
// comes from inside a task, runs serially on its own thread. A forked child (which inherits no
// threads) starts a pool of its own.
#pragma once
#include <ATen/Parallel.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <thread>

namespace {

constexpr int64_t kSpinNs = 1000000; // a worker's busy-wait for the next task before it sleeps
constexpr int kMaxThreads = 255;     // the task word keeps the thread count in 8 bits

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

class Pool {
 public:
  static Pool& get() {
    static Pool* pool = new Pool();  // never destroyed: workers may be blocked at exit
    if (pool->pid_ != getpid()) pool = new Pool();  // a forked child: the old workers are not here
    return *pool;
  }

  // fn(t, nt) for t in 0..nt-1, t = 0 on the calling thread; returns when all have returned.
  template <class F>
  void run(int nt, F& fn) {
    nt = std::min(nt, kMaxThreads);
    if (nt <= 1 || in_task() || !busy_.try_lock()) {
      fn(0, 1);
      return;
    }
    grow(nt - 1);
    call_ = [](void* f, int t, int n) { (*static_cast<F*>(f))(t, n); };
    arg_ = &fn;
    pending_.store(nt - 1, std::memory_order_relaxed);
    // One word holds the task's generation and its thread count, so that a worker never pairs
    // one task's count with another's function.
    word_.store(((word_.load(std::memory_order_relaxed) >> 8) + 1) << 8 | (uint32_t)nt, std::memory_order_release);
    word_.notify_all();
    in_task() = true;
    fn(0, nt);
    in_task() = false;
    while (pending_.load(std::memory_order_acquire) != 0) cpu_relax();
    busy_.unlock();
  }

 private:
  Pool() : pid_(getpid()) {}

  static bool& in_task() {
    static thread_local bool flag = false;
    return flag;
  }

  void grow(int n) {  // under busy_, before the task is published: the workers start from the word now
    const uint32_t now = word_.load(std::memory_order_relaxed);
    while (workers_ < n) {
      const int id = ++workers_;  // worker ids 1..n
      std::thread([this, id, now] { work(id, now); }).detach();
    }
  }

  void work(int id, uint32_t seen) {
    in_task() = true;  // kernels called from a worker's task run inline
    for (;;) {
      uint32_t w;
      const auto t0 = std::chrono::steady_clock::now();
      for (int64_t i = 0; (w = word_.load(std::memory_order_acquire)) == seen; ++i) {
        cpu_relax();
        if ((i & 255) == 255 && std::chrono::duration_cast<std::chrono::nanoseconds>(
                                    std::chrono::steady_clock::now() - t0).count() > kSpinNs)
          word_.wait(seen, std::memory_order_acquire);  // sleep until the next task
      }
      seen = w;
      const int nt = (int)(w & 255);
      if (id < nt) {
        call_(arg_, id, nt);
        pending_.fetch_sub(1, std::memory_order_acq_rel);
      }
    }
  }

  const pid_t pid_;
  std::mutex busy_;
  std::atomic<uint32_t> word_{0};  // generation << 8 | threads of the current task
  std::atomic<int> pending_{0};
  int workers_ = 0;
  void (*call_)(void*, int, int) = nullptr;
  void* arg_ = nullptr;
};

template <class F>
void par_for(int64_t begin, int64_t end, int64_t grain, const F& f) {
  const int64_t n = end - begin;
  if (n <= 0) return;
  const int64_t g = std::max<int64_t>(grain, 1);
  const int64_t chunks = std::min<int64_t>(at::get_num_threads(), (n + g - 1) / g);
  if (chunks <= 1) {
    f(begin, end);
    return;
  }
  auto task = [&](int t, int nt) {
    const int64_t per = (n + nt - 1) / nt;
    const int64_t b = begin + t * per, e = std::min(end, b + per);
    if (b < e) f(b, e);
  };
  Pool::get().run((int)chunks, task);
}

}  // namespace
