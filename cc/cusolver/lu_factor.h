// LU with partial pivoting on CUDA, shared by batchpart_getrf and
// batchpart_gesv (which factors each distinct a once).
#ifndef BATCHPART_CUSOLVER_LU_FACTOR_H_
#define BATCHPART_CUSOLVER_LU_FACTOR_H_

#include <algorithm>
#include <cstdint>

#include "cusolver/solver_api.h"

namespace batchpart::cusolver {

// Factors `count` column-major m x n matrices at `lu` in place (k = min(m,
// n) > 0): `pivots` gets k 1-based pivots per matrix, `info` one info each.
// cuBLAS getrfBatched for square batches that UseBatched picks (jaxlib's
// rule), else cuSOLVER getrf per matrix.
template <typename T>
ffi::Error FactorLu(const char* target, cudaStream_t stream, ffi::ScratchAllocator& scratch,
                    int64_t count, int64_t m, int64_t n, T* lu, int32_t* pivots, int32_t* info) {
  const int m_int = static_cast<int>(m), n_int = static_cast<int>(n);
  const int64_t k = std::min(m, n), size = m * n;
  if (m == n && UseBatched(n, count)) {
    BlasHandle handle;
    BATCHPART_RETURN_IF_ERROR(BorrowBlas(target, stream, &handle));
    T** ptrs;
    BATCHPART_RETURN_IF_ERROR(
        PointerArray(scratch, target, stream, lu, size, IdentityIndex(count), count, &ptrs));
    return ForEachBatchChunk(count, [&](int64_t begin, int chunk) {
      return BlasStatus(target, "getrfBatched",
                        Solver<T>::getrfBatched(handle.get(), n_int, ptrs + begin, n_int,
                                                pivots + begin * n, info + begin, chunk));
    });
  }
  SolverHandle handle;
  BATCHPART_RETURN_IF_ERROR(BorrowSolver(target, stream, &handle));
  return ForEachMatrix<T>(
      scratch, target, "getrf", count,
      [&](int* lwork) {
        return Solver<T>::getrf_bufferSize(handle.get(), m_int, n_int, lu, m_int, lwork);
      },
      [&](int64_t i, T* work, int) {
        return Solver<T>::getrf(handle.get(), m_int, n_int, lu + i * size, m_int, work,
                                pivots + i * k, info + i);
      });
}

}  // namespace batchpart::cusolver

#endif  // BATCHPART_CUSOLVER_LU_FACTOR_H_
