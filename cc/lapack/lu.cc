// batchpart_getrf: batched LU factorization with partial pivoting (getrf).
#include <algorithm>
#include <cstdint>
#include <numeric>

#include "lapack/batch_loop.h"
#include "lapack/kernel_helpers.h"
#include "lapack/kernels.h"

namespace batchpart::lapack {
namespace {

constexpr const char* kTarget = kGetrfTarget;

// Turns getrf's 1-based pivots into 0-based ones and the row permutation
// they describe (apply the swaps, in order, to 0..m-1). A pivot outside
// [i, m) cannot come from LAPACK; it is skipped rather than trusted with a
// memory access.
void PivotsToPermutation(int32_t* pivots, int64_t k, int32_t* perm, int64_t m) {
  std::iota(perm, perm + m, 0);
  for (int64_t i = 0; i < k; ++i) {
    const int32_t p = --pivots[i];
    if (p >= i && p < m) std::swap(perm[i], perm[p]);
  }
}

template <typename T>
void FactorOne(const LuShape& shape, T* lu, int32_t* pivots, int32_t* perm, int32_t* info) {
  lapack_int m = static_cast<lapack_int>(shape.m), n = static_cast<lapack_int>(shape.n);
  lapack_int lda = LeadingDim(shape.m), info_v = 0;
  Lapack<T>::getrf(&m, &n, lu, &lda, pivots, &info_v);
  *info = info_v;
  PivotsToPermutation(pivots, shape.k, perm, shape.m);
}

template <typename T>
ffi::Error Factor(ffi::ThreadPool& pool, const LuShape& shape, const ffi::AnyBuffer& a,
                  ffi::AnyBuffer& lu, ffi::AnyBuffer& pivots, ffi::AnyBuffer& perm,
                  ffi::AnyBuffer& info) {
  static_assert(sizeof(lapack_int) == sizeof(int32_t), "getrf writes pivots in place");
  const int64_t size = shape.m * shape.n;
  const T* a_data = a.typed_data<T>();
  T* lu_data = lu.typed_data<T>();
  int32_t* piv_data = pivots.typed_data<int32_t>();
  int32_t* perm_data = perm.typed_data<int32_t>();
  int32_t* info_data = info.typed_data<int32_t>();
  const double flops = kFlopScale<T> * shape.m * shape.n * shape.k;
  return ForEachBatchChunk(pool, Product(shape.batch), flops, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      CopyIfDistinct(a_data + b * size, lu_data + b * size, size);
      FactorOne<T>(shape, lu_data + b * size, piv_data + b * shape.k, perm_data + b * shape.m,
                   info_data + b);
    }
  });
}

ffi::Error GetrfImpl(ffi::ThreadPool pool, ffi::AnyBuffer a, ffi::Result<ffi::AnyBuffer> lu,
                     ffi::Result<ffi::AnyBuffer> pivots, ffi::Result<ffi::AnyBuffer> perm,
                     ffi::Result<ffi::AnyBuffer> info) {
  BATCHPART_RETURN_IF_ERROR(CheckInitialized(kTarget));
  BATCHPART_ASSIGN_OR_RETURN(const LuShape shape, ValidateGetrf(a, *lu, *pivots, *perm, *info));
  return DispatchByDtype(kTarget, a.element_type(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    return Factor<T>(pool, shape, a, *lu, *pivots, *perm, *info);
  });
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(BatchpartGetrf, GetrfImpl,
                              BindGetrf(ffi::Ffi::Bind().Ctx<ffi::ThreadPool>()));  // info

}  // namespace batchpart::lapack
