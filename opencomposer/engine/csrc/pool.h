// The kernels' thread pool: par_for(begin, end, grain, f, hint) with at::parallel_for's contract
// (f(chunk_begin, chunk_end) over disjoint chunks covering [begin, end), chunks of at least
// `grain` items, at most at::get_num_threads() threads at once; nested calls run inline).
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
//
// A busy machine. A worker that has lost its core to another process (a test suite in a
// sandbox, a server, a pinned busy loop) delays every region it holds a share of, by up to the
// scheduler's time slice (~3 ms against a decode step's 1-5 ms): measured with one busy
// process on one of 2 cores, the first pool of this file (one fixed chunk per thread) decoded
// 6x slower at batch 1 than on one thread. Two things keep the pool at least as fast as one
// thread however the neighbours behave:
//   - pieces, not chunks: a region is cut into up to kPiecesPerThread pieces per thread that
//     the caller and the workers claim one at a time (one CAS on a word that also holds the
//     task's generation, so a claim can never land on another task). A worker that is not
//     running when the task comes leaves its pieces to the caller; only one preempted in the
//     middle of a piece still stalls the region.
//   - threads only on the CPUs that others leave free (policy 3, the default): a sampler
//     thread counts, every kSampleNs while the pool is in use, the CPU time that other
//     processes used on this process's CPUs over the last kWindowNs (/proc/stat less this
//     process's own CPU time), and a region runs on at most the CPUs left (rounded to the
//     nearest, at least one). With one busy neighbour on 2 cores every region runs on the
//     caller alone, within a window of the neighbour starting; quiet, every region runs on
//     both. Measured against policy 2 in the same runs (docs/benchmarks.md, 2026-12-06):
//     policy 2 gave up 13-30% of the quiet speed to its serial probes and shapes that timed
//     serial, and still ran 5-13% below one thread under a pinned busy process.
// Serial and parallel runs compute every item the same way, so no policy changes a bit of the
// output (tests/engine/test_forward.py). Kept for benchmarks/decode.py --pool-policies and the
// tests: policies 0 (one fixed chunk per thread, this file's first pool), 1 (pieces, always
// parallel) and 2 (pieces, adaptive from timings, the default before policy 3: it times regions
// against serial runs of the same shape (call site, items, the caller's work hint): the first
// two calls of a shape, and every kSerialProbeEvery-th after, run serially; a shape whose
// parallel runs are no faster than its serial ones stays serial (re-tried every
// kParallelProbeEvery-th call); and every parallel region adds (its shape's serial time - its
// own time) to a balance. Once the balance is kLossNs in the red, every region runs serially
// for a back-off of kMinBackoffNs, doubled at each relapse up to kMaxBackoffNs and reset after
// a window of kWindowRegions parallel regions in the black).
// Every policy's thread count is also capped by the CPUs this process may run on
// (sched_getaffinity, re-read every 100 ms). Not covered: CPU quotas (cgroup cpu.max) are not
// read; a neighbour that comes and goes faster than kWindowNs is averaged over the window; a
// caller preempted outside a region is no region's fault.
#pragma once
#include <ATen/Parallel.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace {

constexpr int64_t kSpinNs = 1000000; // a worker's busy-wait for the next task before it sleeps
constexpr int kMaxThreads = 255;     // the claim word keeps the thread count in 8 bits
constexpr int kPiecesPerThread = 4;
constexpr uint32_t kSerialProbeEvery = 32;
constexpr uint32_t kParallelProbeEvery = 64;
constexpr int64_t kLossNs = 500000;
constexpr int64_t kWindowRegions = 256;
constexpr int64_t kMinBackoffNs = 20000000;
constexpr int64_t kMaxBackoffNs = 1000000000;
constexpr int64_t kSampleNs = 25000000;    // the sampler's period,
constexpr int64_t kWindowNs = 50000000;    // the span it counts the free CPUs over,
constexpr int64_t kIdleNs = 10000000000;   // and how long it goes on after the last region
constexpr int kShapes = 512;  // direct-mapped table of region shapes
constexpr uint32_t kGenMask = (1u << 23) - 1;  // task generations, as the claim word keeps them

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// What the adaptive policy knows of one region shape: lower envelopes (a fall is followed at
// once by half, a rise by 1/32) of its serial and parallel wall times, so that a run slowed by
// a neighbour weighs little.
struct Shape {
  uint64_t key = 0;
  double serial_ns = 0, parallel_ns = 0;
  uint32_t calls = 0, serial_runs = 0, parallel_runs = 0;
};

inline void envelope(double& cur, uint32_t& runs, int64_t x) {
  cur = runs++ == 0 ? (double)x : cur + (x < cur ? 0.5 : 1.0 / 32) * (x - cur);
}

class Pool {
 public:
  static Pool& get() {
    static Pool* pool = new Pool();  // never destroyed: workers may be blocked at exit
    if (pool->pid_ != getpid()) pool = new Pool();  // a forked child: the old workers are not here
    return *pool;
  }

  // piece(i, m) for i in 0..m-1 (m <= pieces, a whole cut into m pieces) on up to nt threads,
  // the caller one of them, or whole() on the calling thread alone; returns when all have
  // returned. key names the region's shape.
  template <class W, class P>
  void run(int64_t pieces, int nt, uint64_t key, W& whole, P& piece) {
    if (in_task() || !busy_.try_lock()) {
      whole();
      return;
    }
    const int64_t t0 = now_ns();
    const int policy = policy_.load(std::memory_order_relaxed);
    nt = (int)std::min<int64_t>({(int64_t)nt, (int64_t)kMaxThreads, (int64_t)(policy == 3 ? free_cores(t0) : cores(t0)),
                                 pieces});
    if (policy == 0) pieces = nt;  // one chunk per thread
    Shape* s = policy == 2 ? &shape(key) : nullptr;  // what policy 2 times
    if (s) ++s->calls;
    if (nt <= 1 || (s && !parallel_now(*s, t0))) {
      in_task() = true;
      whole();
      in_task() = false;
      if (s) envelope(s->serial_ns, s->serial_runs, now_ns() - t0);
      ++serial_regions_;
      busy_.unlock();
      return;
    }
    grow(nt - 1);
    call_ = [](void* f, int64_t i, int64_t m) { (*static_cast<P*>(f))(i, m); };
    arg_ = &piece;
    done_.store(0, std::memory_order_relaxed);
    gen_ = (gen_ + 1) & kGenMask;
    // generation << 41 | one chunk per thread << 40 | threads << 32 | pieces << 16 | next piece
    // (with one chunk per thread, worker t runs piece t and `next` stays at the pieces: none to claim)
    const uint64_t fixed = policy == 0;
    claim_.store((uint64_t)gen_ << 41 | fixed << 40 | (uint64_t)nt << 32 | (uint64_t)pieces << 16 |
                     (fixed ? (uint64_t)pieces : 0),
                 std::memory_order_release);
    word_.store(word_.load(std::memory_order_relaxed) + 1, std::memory_order_release);
    word_.notify_all();
    in_task() = true;
    if (fixed) {
      piece(0, pieces);
      done_.fetch_add(1, std::memory_order_relaxed);
    } else {
      claim_pieces();
    }
    in_task() = false;
    wait_done(pieces);
    const int64_t t1 = now_ns();
    ++parallel_regions_;
    if (s) {
      envelope(s->parallel_ns, s->parallel_runs, t1 - t0);
      account(*s, t1 - t0, t1);
    }
    busy_.unlock();
  }

  // 0: one fixed chunk per thread; 1: pieces, always parallel; 2: pieces, adaptive from timings;
  // 3: pieces on the free CPUs (the default).
  int set_policy(int p) {
    std::lock_guard<std::mutex> lock(busy_);
    const int old = policy_.exchange(p);  // the shapes' timings (policy 2's alone) are kept
    net_ = 0, serial_until_ = 0, backoff_ = kMinBackoffNs, window_regions_ = 0;
    return old;
  }

  // [policy, parallel regions, serial regions, back-offs, ns spent in back-off, times a CPU was
  // found taken by others, regions run on fewer threads for it, the free CPUs now (0: unknown)]
  std::vector<int64_t> stats() {
    std::lock_guard<std::mutex> lock(busy_);
    return {(int64_t)policy_.load(), parallel_regions_, serial_regions_, backoffs_, backoff_total_ns_,
            capped_windows_.load(), capped_regions_, free_.load()};
  }

 private:
  Pool() : pid_(getpid()) {}

  static bool& in_task() {
    static thread_local bool flag = false;
    return flag;
  }

  int cores(int64_t t) {  // CPUs this process may run on, re-read every 100 ms
    if (t - cores_at_ > 100000000 || cores_ == 0) {
      cpu_set_t set;
      cores_ = sched_getaffinity(0, sizeof set, &set) == 0 ? std::max(1, CPU_COUNT(&set)) : kMaxThreads;
      cores_at_ = t;
    }
    return cores_;
  }

  // Policy 3's cap: of those CPUs, how many the other processes leave to this one (the
  // sampler's count, below); starts the sampler, or wakes it, as the pool is used.
  int free_cores(int64_t t) {
    const int n = cores(t);
    used_at_.store(t, std::memory_order_relaxed);
    if (!sampling_) {
      sampling_ = true;
      std::thread([this] { sample(); }).detach();
    } else if (sampler_asleep_.load(std::memory_order_relaxed)) {
      sampler_asleep_.store(false, std::memory_order_relaxed);
      wake_.fetch_add(1, std::memory_order_release);
      wake_.notify_one();
    }
    const int f = free_.load(std::memory_order_relaxed);
    if (f > 0 && f < n) {
      ++capped_regions_;
      return f;
    }
    return n;
  }

  // The sampler thread: every kSampleNs while the pool is in use (a region in the last kIdleNs;
  // then it sleeps until the next), the CPU time that others used on our CPUs over the last
  // kWindowNs: /proc/stat's busy time on them (clock ticks of 10 ms, every process) less this
  // process's own CPU time (CLOCK_PROCESS_CPUTIME_ID: every thread of it, spinning workers
  // included), per CPU. The CPUs left, rounded to the nearest, are the threads a region may
  // use (free_; at least one). A neighbour pinned to a core takes it out of the count within a
  // window, and gives it back as soon as it stops. Without /proc/stat (some sandboxes), every
  // CPU counts as free. Its cost: one read of /proc/stat every kSampleNs (~0.1% of a core).
  void sample() {
    struct Reading {
      int64_t t, busy, total, own;
    };
    std::vector<Reading> recent;  // oldest first, the newest older than the window kept as its start
    static const double tick_ns = 1e9 / (double)std::max(1L, sysconf(_SC_CLK_TCK));
    for (;;) {
      const int64_t t = now_ns();
      if (t - used_at_.load(std::memory_order_relaxed) > kIdleNs) {
        const uint32_t w = wake_.load(std::memory_order_acquire);
        sampler_asleep_.store(true, std::memory_order_relaxed);
        wake_.wait(w, std::memory_order_acquire);
        recent.clear();
        continue;
      }
      cpu_set_t set;
      Reading r{t, 0, 0, 0};
      if (sched_getaffinity(0, sizeof set, &set) != 0 || !read_stat(set, r.busy, r.total)) {
        free_.store(0, std::memory_order_relaxed);  // unknown: every CPU
        return;
      }
      timespec ts;
      clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
      r.own = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
      while (recent.size() > 1 && t - recent[1].t >= kWindowNs) recent.erase(recent.begin());
      if (!recent.empty() && t - recent[0].t >= kWindowNs && r.total > recent[0].total) {
        const Reading& a = recent[0];
        const int n = std::max(1, CPU_COUNT(&set));
        const double per_cpu = (double)(r.total - a.total) * tick_ns / n;
        const double others = ((double)(r.busy - a.busy) * tick_ns - (double)(r.own - a.own)) / per_cpu;
        const int f = (int)std::clamp<double>(std::floor(n - std::max(0.0, others) + 0.5), 1, n);
        const int before = free_.exchange(f, std::memory_order_relaxed);
        if (f < n && (before == 0 || before >= n)) ++capped_windows_;  // a CPU taken away
      }
      recent.push_back(r);
      std::this_thread::sleep_for(std::chrono::nanoseconds(kSampleNs));
    }
  }

  static bool read_stat(const cpu_set_t& set, int64_t& busy, int64_t& total) {
    FILE* f = std::fopen("/proc/stat", "re");
    if (!f) return false;
    char line[512];
    bool any = false;
    while (std::fgets(line, sizeof line, f)) {
      int cpu;
      unsigned long long v[8] = {0};
      if (std::strncmp(line, "cpu", 3) != 0 || !std::isdigit((unsigned char)line[3])) continue;
      if (std::sscanf(line + 3, "%d %llu %llu %llu %llu %llu %llu %llu %llu", &cpu, &v[0], &v[1], &v[2], &v[3],
                      &v[4], &v[5], &v[6], &v[7]) < 5 ||
          cpu < 0 || cpu >= CPU_SETSIZE || !CPU_ISSET(cpu, &set))
        continue;
      // user nice system idle iowait irq softirq steal: idle and iowait are free time
      int64_t all = 0;
      for (unsigned long long x : v) all += (int64_t)x;
      total += all;
      busy += all - (int64_t)(v[3] + v[4]);
      any = true;
    }
    std::fclose(f);
    return any;
  }

  Shape& shape(uint64_t key) {
    Shape& s = shapes_[(key ^ (key >> 29)) % kShapes];
    if (s.key != key) s = Shape(), s.key = key;
    return s;
  }

  bool parallel_now(const Shape& s, int64_t t) const {
    if (s.serial_runs < 2 || t < serial_until_ || s.calls % kSerialProbeEvery == 0) return false;
    return s.parallel_runs < 2 || s.parallel_ns < s.serial_ns || s.calls % kParallelProbeEvery == 0;
  }

  void account(const Shape& s, int64_t took, int64_t t) {
    net_ += (int64_t)s.serial_ns - took;
    if (net_ < -kLossNs) {  // parallel regions lost more than they won: serial for a while
      serial_until_ = t + backoff_;
      backoff_total_ns_ += backoff_;
      backoff_ = std::min(2 * backoff_, kMaxBackoffNs);
      ++backoffs_;
      net_ = 0;
      window_regions_ = 0;
    } else if (++window_regions_ >= kWindowRegions) {  // enough evidence: parallel regions pay again
      if (net_ >= 0) backoff_ = kMinBackoffNs;
      net_ = 0;
      window_regions_ = 0;
    }
  }

  void claim_pieces() {  // run pieces of the current task until none is left unclaimed
    uint64_t w = claim_.load(std::memory_order_acquire);
    for (;;) {
      const uint64_t next = w & 0xffff, pieces = (w >> 16) & 0xffff;
      if (next >= pieces) return;
      if (claim_.compare_exchange_weak(w, w + 1, std::memory_order_acq_rel, std::memory_order_acquire)) {
        call_(arg_, (int64_t)next, (int64_t)pieces);  // the task stays current until this piece is done
        done_.fetch_add(1, std::memory_order_release);
        w = claim_.load(std::memory_order_acquire);
      }
    }
  }

  void wait_done(int64_t pieces) {  // after ~20 us, yield: a late worker may share our core
    const int64_t t0 = now_ns();
    for (int64_t i = 0; done_.load(std::memory_order_acquire) != pieces; ++i) {
      cpu_relax();
      if ((i & 63) == 63 && now_ns() - t0 > 20000) sched_yield();
    }
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
    uint64_t last = kGenMask + 1;  // the last task whose fixed chunk this worker ran
    for (;;) {
      uint32_t w;
      const int64_t t0 = now_ns();
      for (int64_t i = 0; (w = word_.load(std::memory_order_acquire)) == seen; ++i) {
        cpu_relax();
        if ((i & 255) == 255 && now_ns() - t0 > kSpinNs) word_.wait(seen, std::memory_order_acquire);
      }
      seen = w;
      const uint64_t c = claim_.load(std::memory_order_acquire);
      if (id >= (int)((c >> 32) & 255)) continue;  // the task wants fewer threads
      if (!((c >> 40) & 1)) {
        claim_pieces();
      } else if ((c >> 41) != last) {  // one chunk per thread: piece `id`, once per task
        last = c >> 41;
        call_(arg_, id, (int64_t)((c >> 16) & 0xffff));
        done_.fetch_add(1, std::memory_order_release);
      }
    }
  }

  const pid_t pid_;
  std::mutex busy_;
  std::atomic<uint32_t> word_{0};    // bumped at every task: what sleeping workers wait on
  std::atomic<uint64_t> claim_{0};   // the current task (layout in run)
  std::atomic<int64_t> done_{0};     // its pieces finished
  std::atomic<int> policy_{3};
  uint32_t gen_ = 0;
  int workers_ = 0;
  void (*call_)(void*, int64_t, int64_t) = nullptr;
  void* arg_ = nullptr;
  // the adaptive policy's state, under busy_
  Shape shapes_[kShapes];
  int64_t net_ = 0, serial_until_ = 0, backoff_ = kMinBackoffNs, window_regions_ = 0, backoff_total_ns_ = 0;
  int64_t parallel_regions_ = 0, serial_regions_ = 0, backoffs_ = 0;
  int cores_ = 0;
  int64_t cores_at_ = 0, capped_regions_ = 0;
  // the free CPUs (policy 3), set by the sampler thread
  bool sampling_ = false;
  std::atomic<int> free_{0};  // 0: not known yet (every CPU)
  std::atomic<int64_t> used_at_{0}, capped_windows_{0};
  std::atomic<bool> sampler_asleep_{false};
  std::atomic<uint32_t> wake_{0};
};

// Splits [begin, end) into pieces of at least `grain` items (at most kPiecesPerThread per
// thread) and runs them on the pool. hint: any number that, with the call site and the item
// count, tells regions of different cost apart (the adaptive policy times each shape).
template <class F>
void par_for(int64_t begin, int64_t end, int64_t grain, const F& f, int64_t hint = 0) {
  const int64_t n = end - begin;
  if (n <= 0) return;
  const int64_t g = std::max<int64_t>(grain, 1);
  const int nt = at::get_num_threads();
  int64_t pieces = std::min<int64_t>((int64_t)kPiecesPerThread * std::min(nt, kMaxThreads), (n + g - 1) / g);
  if (nt <= 1 || pieces <= 1) {
    f(begin, end);
    return;
  }
  static const char site = 0;  // one per instantiation, i.e. per calling lambda
  const uint64_t key = ((uint64_t)(uintptr_t)&site * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)n << 40) ^
                       ((uint64_t)hint * 0xC2B2AE3D27D4EB4Full);
  auto whole = [&] { f(begin, end); };
  auto piece = [&](int64_t i, int64_t m) {
    const int64_t per = (n + m - 1) / m;
    const int64_t b = begin + i * per, e = std::min(end, b + per);
    if (b < e) f(b, e);
  };
  Pool::get().run(pieces, nt, key, whole, piece);
}

}  // namespace
