// Runs a kernel's batch loop serially or on XLA's intra-op thread pool.
//
// A LAPACK call on a small matrix takes microseconds, so a batch of many small
// matrices is worth spreading over the pool's threads. A large matrix is not:
// scipy's OpenBLAS already threads inside each call, and running several such
// calls at once would oversubscribe the cores. Tiny total work is not either:
// handing a task to another thread costs microseconds of its own; nor are
// tiny matrices, whose calls contend inside OpenBLAS (see batch_loop.cc).
#ifndef BATCHPART_LAPACK_BATCH_LOOP_H_
#define BATCHPART_LAPACK_BATCH_LOOP_H_

#include <cstdint>
#include <type_traits>

#include "xla/ffi/api/ffi.h"

namespace batchpart::lapack {

// Processes batch elements [begin, end). May throw (e.g. std::bad_alloc for
// its workspace); the loop turns that into an FFI error. A non-owning
// reference to the caller's callable, valid for the ForEachBatchChunk call
// it is passed to: the loop never outlives it, and a reference costs no
// allocation where a std::function of a capturing lambda would.
class ChunkFn {
 public:
  template <typename F, typename = std::enable_if_t<!std::is_same_v<std::decay_t<F>, ChunkFn>>>
  ChunkFn(const F& fn)  // NOLINT(google-explicit-constructor): takes a lambda in place
      : fn_(&fn), call_([](const void* f, int64_t begin, int64_t end) {
          (*static_cast<const F*>(f))(begin, end);
        }) {}
  void operator()(int64_t begin, int64_t end) const { call_(fn_, begin, end); }

 private:
  const void* fn_;
  void (*call_)(const void* fn, int64_t begin, int64_t end);
};

// How many chunks to split a batch into: 1 means "run serially on the
// calling thread". `flops_per_element` is a rough operation count of one
// batch element; `num_threads` is the pool's size.
int64_t NumChunks(int64_t batch, double flops_per_element, int64_t num_threads);

// Runs `run_chunk` over [0, batch), split as NumChunks decides. The calling
// thread works through chunks too, so the loop finishes even if the pool
// never runs a scheduled task (XLA allows that); it returns once every chunk
// is done.
xla::ffi::Error ForEachBatchChunk(xla::ffi::ThreadPool& pool, int64_t batch,
                                  double flops_per_element, const ChunkFn& run_chunk);

// BLAS threading inside a kernel. scipy's OpenBLAS starts its own threads in
// every call; inside XLA, where several devices' kernels and the intra-op
// pool already occupy the cores, that oversubscribes them badly (8 simulated
// devices on 2 cores: two 256x256 SVDs took 2.6 s instead of 23 ms), and its
// threaded routines round differently from its single-threaded ones. Given
// OpenBLAS's thread-local setter (openblas_set_num_threads_local, >= 0.3.27),
// the batch loop runs LAPACK single-threaded on every thread, so a matrix's
// bits do not depend on its batch or on the device count.
using SetLocalBlasThreadsFn = int (*)(int);
void SetLocalBlasThreadsFunction(SetLocalBlasThreadsFn fn);

// Switches the thread pool off (every loop serial) or back on; for
// measurements and for tests that compare both paths.
void SetIntraOpParallelism(bool enabled);
bool IntraOpParallelism();

}  // namespace batchpart::lapack

#endif  // BATCHPART_LAPACK_BATCH_LOOP_H_
