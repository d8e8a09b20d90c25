// batchpart_getrf on CUDA: batched LU factorization with partial pivoting.
#include <algorithm>
#include <cstdint>

#include "cusolver/kernels.h"
#include "cusolver/solver_api.h"

namespace batchpart::cusolver {
namespace {

constexpr const char* kTarget = kGetrfTarget;

template <typename T>
ffi::Error Factor(cudaStream_t stream, ffi::ScratchAllocator& scratch, const LuShape& shape,
                  const ffi::AnyBuffer& a, ffi::AnyBuffer& lu, ffi::AnyBuffer& pivots,
                  ffi::AnyBuffer& perm, ffi::AnyBuffer& info) {
  const int64_t batch = Product(shape.batch), m = shape.m, n = shape.n, k = shape.k;
  if (batch == 0) return ffi::Error::Success();
  const int64_t size = m * n;
  T* lu_data = Data<T>(lu);
  int32_t* piv_data = Data<int32_t>(pivots);
  int32_t* perm_data = Data<int32_t>(perm);
  int32_t* info_data = Data<int32_t>(info);
  BATCHPART_RETURN_IF_ERROR(CopyIfDistinct(kTarget, stream, Data<T>(a), lu_data, batch * size));

  if (k == 0) {  // nothing to factor: identity permutation, info 0
    BATCHPART_RETURN_IF_ERROR(ZeroInts(kTarget, stream, info_data, batch));
  } else if (m == n && UseBatched(n, batch)) {
    BlasHandle handle;
    BATCHPART_RETURN_IF_ERROR(BorrowBlas(kTarget, stream, &handle));
    T** ptrs;
    BATCHPART_RETURN_IF_ERROR(Allocate(scratch, kTarget, "pointer array", batch, &ptrs));
    BATCHPART_RETURN_IF_ERROR(
        CudaStatus(kTarget, "MakePointers",
                   MakePointers(stream, lu_data, size, IdentityIndex(batch), batch, ptrs)));
    const int n_int = static_cast<int>(n);
    BATCHPART_RETURN_IF_ERROR(ForEachBatchChunk(batch, [&](int64_t begin, int count) {
      return BlasStatus(kTarget, "getrfBatched",
                        Solver<T>::getrfBatched(handle.get(), n_int, ptrs + begin, n_int,
                                                piv_data + begin * n, info_data + begin, count));
    }));
  } else {
    SolverHandle handle;
    BATCHPART_RETURN_IF_ERROR(BorrowSolver(kTarget, stream, &handle));
    const int m_int = static_cast<int>(m), n_int = static_cast<int>(n);
    int lwork = 0;
    BATCHPART_RETURN_IF_ERROR(SolverStatus(
        kTarget, "getrf_bufferSize",
        Solver<T>::getrf_bufferSize(handle.get(), m_int, n_int, lu_data, m_int, &lwork)));
    T* work;
    BATCHPART_RETURN_IF_ERROR(Allocate(scratch, kTarget, "getrf workspace", lwork, &work));
    for (int64_t b = 0; b < batch; ++b) {
      BATCHPART_RETURN_IF_ERROR(
          SolverStatus(kTarget, "getrf",
                       Solver<T>::getrf(handle.get(), m_int, n_int, lu_data + b * size, m_int, work,
                                        piv_data + b * k, info_data + b)));
    }
  }
  return CudaStatus(kTarget, "PivotsToPermutation",
                    PivotsToPermutation(stream, piv_data, k, perm_data, m, batch));
}

ffi::Error GetrfImpl(cudaStream_t stream, ffi::ScratchAllocator scratch, ffi::AnyBuffer a,
                     ffi::Result<ffi::AnyBuffer> lu, ffi::Result<ffi::AnyBuffer> pivots,
                     ffi::Result<ffi::AnyBuffer> perm, ffi::Result<ffi::AnyBuffer> info) {
  BATCHPART_ASSIGN_OR_RETURN(const LuShape shape, ValidateGetrf(a, *lu, *pivots, *perm, *info));
  return DispatchByDtype(kTarget, a.element_type(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    return Factor<T>(stream, scratch, shape, a, *lu, *pivots, *perm, *info);
  });
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(BatchpartGetrfCuda, GetrfImpl,
                              BindGetrf(ffi::Ffi::Bind()
                                            .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                            .Ctx<ffi::ScratchAllocator>()));  // info

}  // namespace batchpart::cusolver
