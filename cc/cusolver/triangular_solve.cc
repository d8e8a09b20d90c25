// batchpart_trsm on CUDA: batched triangular solve with broadcast batch dims.
#include <cstdint>

#include "cusolver/kernels.h"
#include "cusolver/solver_api.h"

namespace batchpart::cusolver {
namespace {

constexpr const char* kTarget = kTrsmTarget;

template <typename T>
ffi::Error Solve(cudaStream_t stream, ffi::ScratchAllocator& scratch, const TrsmShape& shape,
                 const TrsmOptions& o, const ffi::AnyBuffer& a, const ffi::AnyBuffer& b,
                 ffi::AnyBuffer& x) {
  const int64_t batch = Product(shape.x_batch), x_size = shape.rows * shape.cols;
  if (batch == 0 || x_size == 0) return ffi::Error::Success();
  T* x_data = Data<T>(x);
  T* a_data = Data<T>(a);

  // X starts as B, broadcast over the output batch.
  BroadcastIndex a_index;
  BATCHPART_RETURN_IF_ERROR(
      BroadcastOperands(kTarget, stream, shape, batch, Data<T>(b), x_size, x_data, &a_index));

  // cuBLAS has no "conjugate, don't transpose": conj(A) X = B is solved as
  // A conj(X) = conj(B).
  const bool conjugate_only = kIsComplex<T> && o.conjugate_a && !o.transpose_a;
  if (conjugate_only) {
    BATCHPART_RETURN_IF_ERROR(
        CudaStatus(kTarget, "Conjugate", Conjugate(stream, x_data, batch * x_size)));
  }
  BlasHandle handle;
  BATCHPART_RETURN_IF_ERROR(BorrowBlas(kTarget, stream, &handle));
  const cublasSideMode_t side = o.left_side ? CUBLAS_SIDE_LEFT : CUBLAS_SIDE_RIGHT;
  const cublasFillMode_t uplo = o.lower ? CUBLAS_FILL_MODE_LOWER : CUBLAS_FILL_MODE_UPPER;
  const cublasOperation_t trans =
      !o.transpose_a ? CUBLAS_OP_N : (o.conjugate_a && kIsComplex<T> ? CUBLAS_OP_C : CUBLAS_OP_T);
  const cublasDiagType_t diag = o.unit_diagonal ? CUBLAS_DIAG_UNIT : CUBLAS_DIAG_NON_UNIT;
  const int rows = static_cast<int>(shape.rows), cols = static_cast<int>(shape.cols);
  const int lda = static_cast<int>(std::max<int64_t>(1, shape.p));
  const int ldb = static_cast<int>(std::max<int64_t>(1, shape.rows));
  const T alpha = HostOne<T>();  // host pointer mode (cuBLAS's default)
  if (batch == 1) {
    BATCHPART_RETURN_IF_ERROR(
        BlasStatus(kTarget, "trsm",
                   Solver<T>::trsm(handle.get(), side, uplo, trans, diag, rows, cols, &alpha,
                                   a_data, lda, x_data, ldb)));
  } else {
    T **a_ptrs, **x_ptrs;
    BATCHPART_RETURN_IF_ERROR(
        PointerArray(scratch, kTarget, stream, a_data, shape.p * shape.p, a_index, batch, &a_ptrs));
    BATCHPART_RETURN_IF_ERROR(PointerArray(scratch, kTarget, stream, x_data, x_size,
                                           IdentityIndex(batch), batch, &x_ptrs));
    BATCHPART_RETURN_IF_ERROR(ForEachBatchChunk(batch, [&](int64_t begin, int count) {
      return BlasStatus(
          kTarget, "trsmBatched",
          Solver<T>::trsmBatched(handle.get(), side, uplo, trans, diag, rows, cols, &alpha,
                                 a_ptrs + begin, lda, x_ptrs + begin, ldb, count));
    }));
  }
  if (conjugate_only) {
    BATCHPART_RETURN_IF_ERROR(
        CudaStatus(kTarget, "Conjugate", Conjugate(stream, x_data, batch * x_size)));
  }
  return ffi::Error::Success();
}

ffi::Error TrsmImpl(cudaStream_t stream, ffi::ScratchAllocator scratch, ffi::AnyBuffer a,
                    ffi::AnyBuffer b, ffi::Result<ffi::AnyBuffer> x, bool left_side, bool lower,
                    bool transpose_a, bool conjugate_a, bool unit_diagonal) {
  BATCHPART_ASSIGN_OR_RETURN(const TrsmShape shape, ValidateTrsm(a, b, *x, left_side));
  const TrsmOptions options{left_side, lower, transpose_a, conjugate_a, unit_diagonal};
  BATCHPART_RETURN_FOR_DTYPE(kTarget, a.element_type(), Solve, stream, scratch, shape, options, a,
                             b, *x);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(BatchpartTrsmCuda, TrsmImpl, BindTrsm(BindCuda()));

}  // namespace batchpart::cusolver
