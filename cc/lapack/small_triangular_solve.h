// Triangular solves of many small matrices at once (batchpart_trsm and
// batchpart_trsm_row_major below a size switch): forward or back
// substitution on groups of kLanes<T> matrices in the batch-interleaved
// layout (interleaved.h), so each scalar step is one SIMD instruction
// across the group instead of one BLAS call per matrix.
#ifndef BATCHPART_LAPACK_SMALL_TRIANGULAR_SOLVE_H_
#define BATCHPART_LAPACK_SMALL_TRIANGULAR_SOLVE_H_

#include <cstdint>

#include "common/contracts.h"
#include "xla/ffi/api/ffi.h"

namespace batchpart::lapack {

// Whether the interleaved kernel takes a solve of this shape: by the
// triangle's size and the type alone (the switch point was measured per
// type), so that a system gets the same bits in any batch.
template <typename T>
bool UsesSmallTrsm(const TrsmShape& shape);

// Solves every batch element of op(A) X = B (or X op(A) = B) into x, as
// BLAS trsm would, with A and B broadcast over the batch; `row_major` says
// how A, B and X are laid out. B and x may be the same buffer. Groups of a
// few systems are solved one by one, with the same bits.
template <typename T>
xla::ffi::Error SmallTrsm(xla::ffi::ThreadPool& pool, const TrsmShape& shape,
                          const TrsmOptions& options, bool row_major, const T* a, const T* b,
                          T* x);

// The largest triangle the kAuto policy gives the interleaved kernel.
template <typename T>
int64_t SmallTrsmMaxSize();

}  // namespace batchpart::lapack

#endif  // BATCHPART_LAPACK_SMALL_TRIANGULAR_SOLVE_H_
