// batchpart_getrf on CUDA: batched LU factorization with partial pivoting.
#include <algorithm>
#include <cstdint>

#include "cusolver/kernels.h"
#include "cusolver/lu_factor.h"
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
  } else {
    BATCHPART_RETURN_IF_ERROR(
        FactorLu(kTarget, stream, scratch, batch, m, n, lu_data, piv_data, info_data));
  }
  return CudaStatus(kTarget, "PivotsToPermutation",
                    PivotsToPermutation(stream, piv_data, k, perm_data, m, batch));
}

ffi::Error GetrfImpl(cudaStream_t stream, ffi::ScratchAllocator scratch, ffi::AnyBuffer a,
                     ffi::Result<ffi::AnyBuffer> lu, ffi::Result<ffi::AnyBuffer> pivots,
                     ffi::Result<ffi::AnyBuffer> perm, ffi::Result<ffi::AnyBuffer> info) {
  BATCHPART_ASSIGN_OR_RETURN(const LuShape shape, ValidateGetrf(a, *lu, *pivots, *perm, *info));
  BATCHPART_RETURN_FOR_DTYPE(kTarget, a.element_type(), Factor, stream, scratch, shape, a, *lu,
                             *pivots, *perm, *info);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(BatchpartGetrfCuda, GetrfImpl, BindGetrf(BindCuda()));

}  // namespace batchpart::cusolver
