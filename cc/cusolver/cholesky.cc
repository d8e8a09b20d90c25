// batchpart_potrf on CUDA: batched Cholesky factorization.
#include <cstdint>

#include "cusolver/kernels.h"
#include "cusolver/solver_api.h"

namespace batchpart::cusolver {
namespace {

constexpr const char* kTarget = kPotrfTarget;

template <typename T>
ffi::Error Factor(cudaStream_t stream, ffi::ScratchAllocator& scratch, int64_t batch, int64_t n,
                  bool lower, bool symmetrize, const ffi::AnyBuffer& a, ffi::AnyBuffer& factor,
                  ffi::AnyBuffer& info) {
  int32_t* info_data = Data<int32_t>(info);
  if (batch == 0) return ffi::Error::Success();
  if (n == 0) return ZeroInts(kTarget, stream, info_data, batch);
  const int64_t size = n * n;
  T* l = Data<T>(factor);
  BATCHPART_RETURN_IF_ERROR(CopyIfDistinct(kTarget, stream, Data<T>(a), l, batch * size));
  if (symmetrize) {
    BATCHPART_RETURN_IF_ERROR(
        CudaStatus(kTarget, "SymmetrizeTriangle", SymmetrizeTriangle(stream, l, n, batch, lower)));
  }

  SolverHandle handle;
  BATCHPART_RETURN_IF_ERROR(BorrowSolver(kTarget, stream, &handle));
  const cublasFillMode_t uplo = lower ? CUBLAS_FILL_MODE_LOWER : CUBLAS_FILL_MODE_UPPER;
  const int n_int = static_cast<int>(n);
  if (UseBatched(n, batch)) {
    T** ptrs;
    BATCHPART_RETURN_IF_ERROR(
        PointerArray(scratch, kTarget, stream, l, size, IdentityIndex(batch), batch, &ptrs));
    BATCHPART_RETURN_IF_ERROR(ForEachBatchChunk(batch, [&](int64_t begin, int count) {
      return SolverStatus(kTarget, "potrfBatched",
                          Solver<T>::potrfBatched(handle.get(), uplo, n_int, ptrs + begin, n_int,
                                                  info_data + begin, count));
    }));
  } else {
    BATCHPART_RETURN_IF_ERROR(ForEachMatrix<T>(
        scratch, kTarget, "potrf", batch,
        [&](int* lwork) {
          return Solver<T>::potrf_bufferSize(handle.get(), uplo, n_int, l, n_int, lwork);
        },
        [&](int64_t b, T* work, int lwork) {
          return Solver<T>::potrf(handle.get(), uplo, n_int, l + b * size, n_int, work, lwork,
                                  info_data + b);
        }));
  }
  return CudaStatus(kTarget, "FinishCholesky",
                    FinishCholesky(stream, l, n, batch, lower, info_data));
}

ffi::Error PotrfImpl(cudaStream_t stream, ffi::ScratchAllocator scratch, ffi::AnyBuffer a,
                     ffi::Result<ffi::AnyBuffer> factor, ffi::Result<ffi::AnyBuffer> info,
                     bool lower, bool symmetrize) {
  BATCHPART_ASSIGN_OR_RETURN(const CholeskyShape shape, ValidatePotrf(a, *factor, *info));
  BATCHPART_RETURN_FOR_DTYPE(kTarget, a.element_type(), Factor, stream, scratch,
                             Product(shape.batch), shape.n, lower, symmetrize, a, *factor, *info);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(BatchpartPotrfCuda, PotrfImpl, BindPotrf(BindCuda()));

}  // namespace batchpart::cusolver
