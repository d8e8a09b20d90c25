// batchpart_eigh on CUDA: batched Hermitian eigendecomposition.
#include <cstdint>
#include <memory>

#include "cusolver/kernels.h"
#include "cusolver/solver_api.h"

namespace batchpart::cusolver {
namespace {

constexpr const char* kTarget = kEighTarget;

template <typename T>
ffi::Error Decompose(cudaStream_t stream, ffi::ScratchAllocator& scratch, const EighShape& shape,
                     bool lower, const ffi::AnyBuffer& a, ffi::AnyBuffer& w, ffi::AnyBuffer& v,
                     ffi::AnyBuffer& info) {
  using R = GpuReal<T>;
  const int64_t batch = Product(shape.batch), n = shape.n, size = n * n;
  int32_t* info_data = Data<int32_t>(info);
  if (batch == 0) return ffi::Error::Success();
  if (n == 0) return ZeroInts(kTarget, stream, info_data, batch);
  const bool vectors = shape.v_cols > 0;
  R* w_data = Data<R>(w);

  // The solver overwrites its matrix: the eigenvector output when wanted,
  // else a scratch copy.
  T* matrix;
  if (vectors) {
    matrix = Data<T>(v);
  } else {
    BATCHPART_RETURN_IF_ERROR(Allocate(scratch, kTarget, "a copy", batch * size, &matrix));
  }
  BATCHPART_RETURN_IF_ERROR(CopyIfDistinct(kTarget, stream, Data<T>(a), matrix, batch * size));
  int32_t* flags;
  BATCHPART_RETURN_IF_ERROR(Allocate(scratch, kTarget, "flags", batch, &flags));
  BATCHPART_RETURN_IF_ERROR(
      CudaStatus(kTarget, "SanitizeNonFinite",
                 SanitizeNonFinite(stream, matrix, n, n, batch,
                                   lower ? Region::kLower : Region::kUpper, flags)));

  SolverHandle handle;
  BATCHPART_RETURN_IF_ERROR(BorrowSolver(kTarget, stream, &handle));
  const cusolverEigMode_t jobz = vectors ? CUSOLVER_EIG_MODE_VECTOR : CUSOLVER_EIG_MODE_NOVECTOR;
  const cublasFillMode_t uplo = lower ? CUBLAS_FILL_MODE_LOWER : CUBLAS_FILL_MODE_UPPER;
  const int n_int = static_cast<int>(n);
  if (n <= kSmallMatrix) {
    // Jacobi, all matrices in one call; eigenvalues sorted ascending.
    JacobiParams<syevjInfo_t, cusolverDnDestroySyevjInfo> params;
    BATCHPART_RETURN_IF_ERROR(SolverStatus(kTarget, "cusolverDnCreateSyevjInfo",
                                           cusolverDnCreateSyevjInfo(&params.params)));
    BATCHPART_RETURN_IF_ERROR(SolverStatus(kTarget, "cusolverDnXsyevjSetSortEig",
                                           cusolverDnXsyevjSetSortEig(params.params, 1)));
    BATCHPART_RETURN_IF_ERROR(ForEachBatchChunk(batch, [&](int64_t begin, int count) {
      T* chunk = matrix + begin * size;
      R* chunk_w = w_data + begin * n;
      int lwork = 0;
      BATCHPART_RETURN_IF_ERROR(SolverStatus(
          kTarget, "syevjBatched_bufferSize",
          Solver<T>::syevjBatched_bufferSize(handle.get(), jobz, uplo, n_int, chunk, n_int, chunk_w,
                                             &lwork, params.params, count)));
      T* work;
      BATCHPART_RETURN_IF_ERROR(Allocate(scratch, kTarget, "syevj workspace", lwork, &work));
      return SolverStatus(
          kTarget, "syevjBatched",
          Solver<T>::syevjBatched(handle.get(), jobz, uplo, n_int, chunk, n_int, chunk_w, work,
                                  lwork, info_data + begin, params.params, count));
    }));
  } else {
    BATCHPART_RETURN_IF_ERROR(ForEachMatrix<T>(
        scratch, kTarget, "syevd", batch,
        [&](int* lwork) {
          return Solver<T>::syevd_bufferSize(handle.get(), jobz, uplo, n_int, matrix, n_int,
                                             w_data, lwork);
        },
        [&](int64_t b, T* work, int lwork) {
          return Solver<T>::syevd(handle.get(), jobz, uplo, n_int, matrix + b * size, n_int,
                                  w_data + b * n, work, lwork, info_data + b);
        }));
  }
  return CudaStatus(
      kTarget, "FinishDecomposition",
      FinishDecomposition<T>(stream, flags, info_data, batch, w_data, n, vectors ? matrix : nullptr,
                             vectors ? size : 0, nullptr, 0));
}

ffi::Error EighImpl(cudaStream_t stream, ffi::ScratchAllocator scratch, ffi::AnyBuffer a,
                    ffi::Result<ffi::AnyBuffer> w, ffi::Result<ffi::AnyBuffer> v,
                    ffi::Result<ffi::AnyBuffer> info, bool lower, bool compute_vectors) {
  BATCHPART_ASSIGN_OR_RETURN(const EighShape shape,
                             ValidateEigh(a, *w, *v, *info, compute_vectors));
  BATCHPART_RETURN_FOR_DTYPE(kTarget, a.element_type(), Decompose, stream, scratch, shape, lower, a,
                             *w, *v, *info);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(BatchpartEighCuda, EighImpl, BindEigh(BindCuda()));

}  // namespace batchpart::cusolver
