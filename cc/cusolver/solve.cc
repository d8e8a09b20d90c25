// batchpart_gesv on CUDA: batched general solve A X = B (getrf + getrs) with
// broadcast batch dims.
#include <cstdint>

#include "cusolver/kernels.h"
#include "cusolver/lu_factor.h"
#include "cusolver/solver_api.h"

namespace batchpart::cusolver {
namespace {

constexpr const char* kTarget = kGesvTarget;

template <typename T>
ffi::Error Solve(cudaStream_t stream, ffi::ScratchAllocator& scratch, const GesvShape& shape,
                 const ffi::AnyBuffer& a, const ffi::AnyBuffer& b, ffi::AnyBuffer& x,
                 ffi::AnyBuffer& info) {
  const int64_t x_count = Product(shape.x_batch), n = shape.n, nrhs = shape.nrhs;
  const int64_t a_count = Product(shape.a_batch), x_size = n * nrhs;
  int32_t* info_data = Data<int32_t>(info);
  if (x_count == 0) return ffi::Error::Success();
  if (n == 0) return ZeroInts(kTarget, stream, info_data, x_count);  // x is empty
  T* x_data = Data<T>(x);

  T* lu;
  int32_t *pivots, *a_info;
  BATCHPART_RETURN_IF_ERROR(Allocate(scratch, kTarget, "LU", a_count * n * n, &lu));
  BATCHPART_RETURN_IF_ERROR(Allocate(scratch, kTarget, "pivots", a_count * n, &pivots));
  BATCHPART_RETURN_IF_ERROR(Allocate(scratch, kTarget, "info", a_count, &a_info));
  BATCHPART_RETURN_IF_ERROR(CopyIfDistinct(kTarget, stream, Data<T>(a), lu, a_count * n * n));
  // Each distinct A once, as batchpart_getrf factors it.
  BATCHPART_RETURN_IF_ERROR(FactorLu(kTarget, stream, scratch, a_count, n, n, lu, pivots, a_info));

  BroadcastIndex a_index;
  BATCHPART_RETURN_IF_ERROR(BroadcastOperands(kTarget, stream, shape, x_count, Data<T>(b), x_size,
                                              x_data, &a_index));

  const int n_int = static_cast<int>(n), nrhs_int = static_cast<int>(nrhs);
  if (nrhs == 0) {
    // Nothing to solve; info still reports the factorizations.
  } else if (UseBatched(n, x_count)) {
    // getrsBatched takes one contiguous pivot array: gather A's per output.
    int32_t* x_pivots = pivots;
    if (a_count != x_count) {
      BATCHPART_RETURN_IF_ERROR(Allocate(scratch, kTarget, "pivots", x_count * n, &x_pivots));
      BATCHPART_RETURN_IF_ERROR(CudaStatus(
          kTarget, "BroadcastCopy", BroadcastCopy(stream, pivots, n, a_index, x_count, x_pivots)));
    }
    T **a_ptrs, **x_ptrs;
    BATCHPART_RETURN_IF_ERROR(
        PointerArray(scratch, kTarget, stream, lu, n * n, a_index, x_count, &a_ptrs));
    BATCHPART_RETURN_IF_ERROR(PointerArray(scratch, kTarget, stream, x_data, x_size,
                                           IdentityIndex(x_count), x_count, &x_ptrs));
    BlasHandle handle;
    BATCHPART_RETURN_IF_ERROR(BorrowBlas(kTarget, stream, &handle));
    BATCHPART_RETURN_IF_ERROR(ForEachBatchChunk(x_count, [&](int64_t begin, int chunk) {
      int argument_info = 0;  // host: nonzero only for an invalid argument
      BATCHPART_RETURN_IF_ERROR(
          BlasStatus(kTarget, "getrsBatched",
                     Solver<T>::getrsBatched(handle.get(), CUBLAS_OP_N, n_int, nrhs_int,
                                             a_ptrs + begin, n_int, x_pivots + begin * n,
                                             x_ptrs + begin, n_int, &argument_info, chunk)));
      if (argument_info != 0) {
        return ffi::Error::Internal(std::string(kTarget) +
                                    ": cuBLAS getrsBatched rejected argument " +
                                    std::to_string(-argument_info));
      }
      return ffi::Error::Success();
    }));
  } else {
    SolverHandle handle;
    BATCHPART_RETURN_IF_ERROR(BorrowSolver(kTarget, stream, &handle));
    int* dev_info;  // getrs's, which reports only invalid arguments
    BATCHPART_RETURN_IF_ERROR(Allocate(scratch, kTarget, "info", 1, &dev_info));
    for (int64_t i = 0; i < x_count; ++i) {
      const int64_t ai = a_index(i);
      BATCHPART_RETURN_IF_ERROR(SolverStatus(
          kTarget, "getrs",
          Solver<T>::getrs(handle.get(), CUBLAS_OP_N, n_int, nrhs_int, lu + ai * n * n, n_int,
                           pivots + ai * n, x_data + i * x_size, n_int, dev_info)));
    }
  }
  // info over the broadcast batch is A's getrf info; a singular A gives NaN.
  return CudaStatus(kTarget, "FinishSolve",
                    FinishSolve(stream, a_info, a_index, info_data, x_data, x_size, x_count));
}

ffi::Error GesvImpl(cudaStream_t stream, ffi::ScratchAllocator scratch, ffi::AnyBuffer a,
                    ffi::AnyBuffer b, ffi::Result<ffi::AnyBuffer> x,
                    ffi::Result<ffi::AnyBuffer> info) {
  BATCHPART_ASSIGN_OR_RETURN(const GesvShape shape, ValidateGesv(a, b, *x, *info));
  BATCHPART_RETURN_FOR_DTYPE(kTarget, a.element_type(), Solve, stream, scratch, shape, a, b, *x,
                             *info);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(BatchpartGesvCuda, GesvImpl, BindGesv(BindCuda()));

}  // namespace batchpart::cusolver
