#include "lapack/batch_loop.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <string>

namespace batchpart::lapack {
namespace ffi = xla::ffi;
namespace {

// The cut-offs below were measured on 2 cores (scipy 1.17's OpenBLAS, jax
// 0.10.2), comparing each kernel's loop with and without the pool.
//
// Work below this many flops per chunk does not repay a thread hop (a few
// microseconds at a few GFLOP/s per core for small-matrix LAPACK).
constexpr double kMinFlopsPerChunk = 2e5;
// Elements cheaper than this (potrf/getrf below about 8x8) ran 2-3x SLOWER
// on two threads than on one: each such call is shorter than the per-call
// bookkeeping OpenBLAS does under a shared lock, so threads mostly contend.
constexpr double kMinFlopsPerParallelElement = 500;
// Above this many flops per element (about a 128x128 LU, a 64x64 SVD) each
// element is a chunk of its own: long enough to repay its claim, and
// single-threaded calls side by side did better than one call after another
// on two BLAS threads (8 matrices of 256x256 on 2 threads: qr 1.5x, svd
// 2.0x, eigh 1.6x, lu 1.2x faster).
constexpr double kMaxFlopsPerParallelElement = 2e6;
// More chunks than threads evens out elements of unequal cost (iterative
// eigen/SVD solvers) and threads that start late.
constexpr int64_t kChunksPerThread = 4;
// OpenBLAS runs calls on matrices up to 32x32 on the calling thread anyway
// (its own size cut-offs for threading), and setting its thread count costs
// about 3 us, more than a batch of 8 8x8 trsm: below this many flops per
// element the loop leaves BLAS threading alone.
constexpr double kMinFlopsForBlasThreads = 32.0 * 32.0 * 32.0;

std::atomic<bool> g_parallel_enabled{true};
std::atomic<SetLocalBlasThreadsFn> g_set_local_blas_threads{nullptr};

// The loops running with one BLAS thread, and the count to restore after
// the last of them (guarded by g_blas_mu).
std::mutex g_blas_mu;
int64_t g_blas_users = 0;
int g_blas_restore = 0;

// Runs BLAS on one thread for the lifetime of the object. In scipy's
// OpenBLAS (built with pthreads) the "local" setter sets the process's
// count, so overlapping loops on several threads share one setting: the
// first sets one thread, the last restores what the first found. A loop
// restoring its own on exit would let a loop still running make its later
// calls threaded, with bits that vary from run to run (a parallel batch of
// 57 x 57 complex64 SVDs did). Each entrant still sets it, for builds where
// the setting is the calling thread's.
class ScopedBlasThreads {
 public:
  explicit ScopedBlasThreads(bool single) {
    SetLocalBlasThreadsFn set = g_set_local_blas_threads.load();
    if (!single || set == nullptr) return;
    set_ = set;
    std::lock_guard<std::mutex> lock(g_blas_mu);
    const int previous = set_(1);
    if (g_blas_users++ == 0) g_blas_restore = previous;
  }
  ~ScopedBlasThreads() {
    if (set_ == nullptr) return;
    std::lock_guard<std::mutex> lock(g_blas_mu);
    if (--g_blas_users == 0) set_(g_blas_restore);
  }
  ScopedBlasThreads(const ScopedBlasThreads&) = delete;
  ScopedBlasThreads& operator=(const ScopedBlasThreads&) = delete;

 private:
  SetLocalBlasThreadsFn set_ = nullptr;
};

// Shared by the calling thread and the pool tasks. Tasks hold it by
// shared_ptr: one may start after the loop has returned, find no chunk left
// and must still find this state alive.
struct LoopState {
  LoopState(int64_t batch_size, int64_t chunks, bool single_blas)
      : batch(batch_size), num_chunks(chunks), single_threaded_blas(single_blas) {}

  bool AllFinished() const { return finished.load(std::memory_order_acquire) == num_chunks; }

  const int64_t batch;
  const int64_t num_chunks;
  const bool single_threaded_blas;
  std::atomic<int64_t> next_chunk{0};
  std::atomic<int64_t> finished{0};

  std::mutex mu;
  std::condition_variable all_done;  // notified under mu once finished == num_chunks
  std::string error;                 // guarded by mu; the first chunk failure
};

// Runs elements [begin, end), reporting an exception as a message.
std::string RunElements(int64_t begin, int64_t end, const ChunkFn& run_chunk) {
  try {
    run_chunk(begin, end);
  } catch (const std::exception& e) {
    return e.what()[0] ? e.what() : "unknown exception";
  } catch (...) {
    return "unknown exception";
  }
  return "";
}

// Claims chunks until none is left; returns how many it ran. `run_chunk`
// is only touched while a chunk is claimed, i.e. before the caller can have
// returned.
int64_t Drain(LoopState& state, const ChunkFn& run_chunk) {
  const ScopedBlasThreads blas_threads(state.single_threaded_blas);
  int64_t ran = 0;
  for (int64_t chunk; (chunk = state.next_chunk.fetch_add(1)) < state.num_chunks; ++ran) {
    std::string error = RunElements(state.batch * chunk / state.num_chunks,
                                    state.batch * (chunk + 1) / state.num_chunks, run_chunk);
    if (!error.empty()) {
      std::lock_guard<std::mutex> lock(state.mu);
      if (state.error.empty()) state.error = std::move(error);
    }
    // The lock orders the notification after a waiter's last look at the
    // count, so the wake-up cannot fall between that look and its sleep.
    if (state.finished.fetch_add(1, std::memory_order_acq_rel) + 1 == state.num_chunks) {
      std::lock_guard<std::mutex> lock(state.mu);
      state.all_done.notify_all();
    }
  }
  return ran;
}

// A hint to the CPU that this thread is spinning (x86's pause), so that
// it yields its core's resources to the other hyperthread meanwhile.
inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Waits until every chunk is done, spinning for up to `spin` first. By
// the time the calling thread gets here no chunk is left to claim, so what
// remains is the pool threads' last chunks, at most about one chunk's time.
// Put to sleep, the caller needs a wake-up of its own when they end, which
// on a 2-vCPU virtual machine took as long as half a small batch: a
// 1024 x 8 x 8 float32 LU took 37-47 us serially, 62-80 us on two threads,
// and 24-29 us spinning.
void WaitForAll(LoopState& state, std::chrono::nanoseconds spin) {
  const auto give_up = std::chrono::steady_clock::now() + spin;
  while (!state.AllFinished()) {
    for (int i = 0; i < 64 && !state.AllFinished(); ++i) CpuRelax();
    if (std::chrono::steady_clock::now() > give_up) {
      std::unique_lock<std::mutex> lock(state.mu);
      state.all_done.wait(lock, [&] { return state.AllFinished(); });
      return;
    }
  }
}

// How long the caller spins for the last chunks, given that it ran `ran`
// of them in `elapsed`: up to twice its mean chunk, where chunks are short
// enough for a wake-up to matter, and not at all where they are long or
// unknown. A spinning thread holds its core, which matters where threads
// outnumber cores (8 simulated devices on 2): there yielding the core
// between spins made a 2048 x 16 x 16 float64 LU slower (585 -> 795 us),
// and a thread that spins only where a wake-up would cost about a chunk
// leaves long chunks (per-matrix LAPACK on large matrices) as they were.
std::chrono::nanoseconds SpinLimit(std::chrono::nanoseconds elapsed, int64_t ran) {
  constexpr std::chrono::nanoseconds kMaxSpin = std::chrono::microseconds(100);
  if (ran == 0) return std::chrono::nanoseconds(0);
  const std::chrono::nanoseconds mean = elapsed / ran;
  return mean > kMaxSpin ? std::chrono::nanoseconds(0) : std::min(2 * mean, kMaxSpin);
}

ffi::Error ChunkError(const std::string& message) {
  return ffi::Error(ffi::ErrorCode::kResourceExhausted,
                    "batchpart LAPACK kernel failed: " + message);
}

}  // namespace

int64_t NumChunks(int64_t batch, double flops_per_element, int64_t num_threads) {
  if (num_threads <= 1 || batch <= 1) return 1;
  if (flops_per_element < kMinFlopsPerParallelElement) return 1;
  if (flops_per_element > kMaxFlopsPerParallelElement) return batch;
  const double total = static_cast<double>(batch) * flops_per_element;
  const int64_t affordable = static_cast<int64_t>(total / kMinFlopsPerChunk);
  const int64_t chunks = std::min({batch, affordable, num_threads * kChunksPerThread});
  // Threads claim chunks one at a time, so a count that is not a multiple
  // of theirs leaves threads idle for the last chunk: 3 chunks on 2 threads
  // take 2/3 of the serial time, where 2 take 1/2.
  if (chunks <= num_threads) return std::max<int64_t>(1, chunks);
  return chunks / num_threads * num_threads;
}

ffi::Error ForEachBatchChunk(ffi::ThreadPool& pool, int64_t batch, double flops_per_element,
                             const ChunkFn& run_chunk) {
  if (batch <= 0) return ffi::Error::Success();
  const int64_t num_threads = g_parallel_enabled.load() ? pool.num_threads() : 1;
  const int64_t num_chunks = NumChunks(batch, flops_per_element, num_threads);
  // Never on BLAS threads, whatever the batch: OpenBLAS's threaded potrf and
  // getrf give other bits than its single-threaded ones (200 x 200 float64),
  // and a matrix's bits must not depend on how many others share its call.
  const bool single_blas = flops_per_element >= kMinFlopsForBlasThreads;
  if (num_chunks == 1) {
    // Serial: no state to share, no lock (a batch of tiny matrices takes a
    // few microseconds, and allocations and locks are a visible part of it).
    const ScopedBlasThreads blas_threads(single_blas);
    const std::string error = RunElements(0, batch, run_chunk);
    return error.empty() ? ffi::Error::Success() : ChunkError(error);
  }
  auto state = std::make_shared<LoopState>(batch, num_chunks, single_blas);
  // The calling thread is one worker; the pool supplies the others.
  const int64_t num_tasks = std::min(num_chunks, num_threads) - 1;
  const ChunkFn* shared_fn = &run_chunk;
  for (int64_t t = 0; t < num_tasks; ++t) {
    pool.Schedule([state, shared_fn] { Drain(*state, *shared_fn); });
  }
  const auto start = std::chrono::steady_clock::now();
  const int64_t ran = Drain(*state, run_chunk);
  WaitForAll(*state, SpinLimit(std::chrono::steady_clock::now() - start, ran));
  std::lock_guard<std::mutex> lock(state->mu);
  return state->error.empty() ? ffi::Error::Success() : ChunkError(state->error);
}

void SetLocalBlasThreadsFunction(SetLocalBlasThreadsFn fn) { g_set_local_blas_threads = fn; }

void SetIntraOpParallelism(bool enabled) { g_parallel_enabled.store(enabled); }
bool IntraOpParallelism() { return g_parallel_enabled.load(); }

}  // namespace batchpart::lapack
