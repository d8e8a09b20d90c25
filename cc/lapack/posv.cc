// batchpart_posv: batched Hermitian positive-definite solve (potrf + potrs)
// with broadcast batch dims; contract in option_kernels.h.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/batch_broadcast.h"
#include "common/contracts.h"
#include "lapack/batch_loop.h"
#include "lapack/kernel_helpers.h"
#include "lapack/kernel_steps.h"
#include "lapack/option_kernels.h"

namespace batchpart::lapack {
namespace {

constexpr char kTarget[] = "batchpart_posv";

// A chunk's Cholesky factor of the A it factored last: consecutive batch
// elements that share a broadcast A factor it once.
template <typename T>
struct FactorCache {
  explicit FactorCache(int64_t n) : factor(n * n) {}
  std::vector<T> factor;
  int64_t a_index = -1;
  int32_t info = 0;
};

template <typename T>
void Factor(int64_t n_, char uplo, const T* a, int64_t a_index, FactorCache<T>& cache) {
  if (cache.a_index == a_index) return;
  std::copy_n(a, n_ * n_, cache.factor.data());
  lapack_int n = static_cast<lapack_int>(n_), lda = LeadingDim(n_), info = 0;
  Lapack<T>::potrf(&uplo, &n, cache.factor.data(), &lda, &info);
  cache.a_index = a_index;
  cache.info = info;
}

template <typename T>
ffi::Error Solve(ffi::ThreadPool& pool, const GesvShape& shape, bool lower, const ffi::AnyBuffer& a,
                 const ffi::AnyBuffer& b, ffi::AnyBuffer& x, ffi::AnyBuffer& info) {
  const int64_t n = shape.n;
  char uplo = lower ? 'L' : 'U';
  const double flops = kFlopScale<T> * (n * n * n / 3.0 + 2.0 * n * n * shape.nrhs);
  return SolveEachBatchElement<T, FactorCache<T>>(
      pool, shape, flops, a, b, x, info,
      [&](const T* ai, int64_t a_index, FactorCache<T>& cache) {
        Factor<T>(n, uplo, ai, a_index, cache);
      },
      [&](FactorCache<T>& cache, T* xi, int32_t* info_i) {
        *info_i = cache.info;
        if (cache.info != 0) {
          FillNaN(xi, n * shape.nrhs);
          return;
        }
        lapack_int n_v = static_cast<lapack_int>(n), nrhs = static_cast<lapack_int>(shape.nrhs);
        lapack_int lda = LeadingDim(n), ldb = LeadingDim(n), potrs_info = 0;
        Lapack<T>::potrs(&uplo, &n_v, &nrhs, cache.factor.data(), &lda, xi, &ldb, &potrs_info);
      });
}

ffi::Error PosvImpl(ffi::ThreadPool pool, ffi::AnyBuffer a, ffi::AnyBuffer b,
                    ffi::Result<ffi::AnyBuffer> x, ffi::Result<ffi::AnyBuffer> info, bool lower) {
  BATCHPART_RETURN_IF_ERROR(CheckInitialized(kTarget));
  // The shapes of a general solve; only the triangle of a that potrf reads differs.
  BATCHPART_ASSIGN_OR_RETURN(const GesvShape shape, ValidateGesv(a, b, *x, *info, kTarget));
  return DispatchByDtype(kTarget, a.element_type(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    return Solve<T>(pool, shape, lower, a, b, *x, *info);
  });
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(BatchpartPosv, PosvImpl,
                              BindGesv(ffi::Ffi::Bind().Ctx<ffi::ThreadPool>())
                                  .Attr<bool>("lower"));

}  // namespace batchpart::lapack
