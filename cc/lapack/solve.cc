// batchpart_gesv and batchpart_gesv_row_major: batched general solve
// A X = B with broadcast batch dims, of column-major (getrf + getrs) or
// row-major matrices (lu_steps.h).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/batch_broadcast.h"
#include "lapack/batch_loop.h"
#include "lapack/kernel_helpers.h"
#include "lapack/kernel_steps.h"
#include "lapack/kernels.h"
#include "lapack/lu_steps.h"

namespace batchpart::lapack {
namespace {

// A chunk's LU of the A it factored last. When A is broadcast against many
// right-hand sides, consecutive batch elements share it, and it is factored
// once per chunk instead of once per element.
template <typename T>
struct LuCache {
  explicit LuCache(int64_t n) : lu(n * n), pivots(std::max<int64_t>(1, n)) {}
  std::vector<T> lu;
  std::vector<lapack_int> pivots;
  int64_t a_index = -1;  // which batch element of A `lu` holds
  int32_t info = 0;
};

template <typename T>
void LapackFactor(int64_t n_, const T* a, int64_t a_index, LuCache<T>& cache) {
  if (cache.a_index == a_index) return;
  std::copy_n(a, n_ * n_, cache.lu.data());
  lapack_int n = static_cast<lapack_int>(n_), lda = LeadingDim(n_), info = 0;
  Lapack<T>::getrf(&n, &n, cache.lu.data(), &lda, cache.pivots.data(), &info);
  cache.a_index = a_index;
  cache.info = info;
}

// Solves in place in x (which holds B) with the cached LU; an exactly
// singular A (getrf's info > 0) gives an all-NaN x.
template <typename T>
void LapackSolve(const GesvShape& shape, const LuCache<T>& cache, T* x, int32_t* info) {
  *info = cache.info;
  if (cache.info != 0) {
    FillNaN(x, shape.n * shape.nrhs);
    return;
  }
  char trans = 'N';
  lapack_int n = static_cast<lapack_int>(shape.n), nrhs = static_cast<lapack_int>(shape.nrhs);
  lapack_int lda = LeadingDim(shape.n), ldb = LeadingDim(shape.n), getrs_info = 0;
  Lapack<T>::getrs(&trans, &n, &nrhs, const_cast<T*>(cache.lu.data()), &lda,
                   const_cast<lapack_int*>(cache.pivots.data()), x, &ldb, &getrs_info);
}

// The column-major kernel: LAPACK's getrf and getrs.
template <typename T>
struct ColumnMajor {
  using Cache = LuCache<T>;
  static void Factor(int64_t n, const T* a, int64_t a_index, Cache& cache) {
    LapackFactor<T>(n, a, a_index, cache);
  }
  static void Solve(const GesvShape& shape, const Cache& cache, T* x, int32_t* info) {
    LapackSolve<T>(shape, cache, x, info);
  }
};

// The row-major kernel: LU and substitution on rows (lu_steps.h).
template <typename T>
struct RowMajor {
  struct Cache {
    explicit Cache(int64_t n) : lu(n * n), pivots(std::max<int64_t>(1, n)) {}
    std::vector<T> lu, scratch;
    std::vector<int32_t> pivots;
    int64_t a_index = -1;  // which batch element of A `lu` holds
    int32_t info = 0;
  };
  static void Factor(int64_t n, const T* a, int64_t a_index, Cache& cache) {
    if (cache.a_index == a_index) return;
    std::copy_n(a, n * n, cache.lu.data());
    cache.info = FactorRowMajor(n, n, cache.lu.data(), cache.pivots.data(), cache.scratch);
    cache.a_index = a_index;
  }
  static void Solve(const GesvShape& shape, const Cache& cache, T* x, int32_t* info) {
    *info = cache.info;
    if (cache.info != 0) {
      FillNaN(x, shape.n * shape.nrhs);
      return;
    }
    SolveRowMajorLu(shape.n, shape.nrhs, cache.lu.data(), cache.pivots.data(), x);
  }
};

template <typename T, template <typename> class Order>
ffi::Error Solve(ffi::ThreadPool& pool, const GesvShape& shape, const ffi::AnyBuffer& a,
                 const ffi::AnyBuffer& b, ffi::AnyBuffer& x, ffi::AnyBuffer& info) {
  using Kernel = Order<T>;
  const int64_t n = shape.n;
  const double flops = kFlopScale<T> * (2.0 * n * n * n / 3.0 + 2.0 * n * n * shape.nrhs);
  return SolveEachBatchElement<T, typename Kernel::Cache>(
      pool, shape, flops, a, b, x, info,
      [&](const T* ai, int64_t a_index, typename Kernel::Cache& cache) {
        Kernel::Factor(n, ai, a_index, cache);
      },
      [&](const typename Kernel::Cache& cache, T* xi, int32_t* info_i) {
        Kernel::Solve(shape, cache, xi, info_i);
      });
}

template <template <typename> class Order>
ffi::Error GesvImpl(const char* target, ffi::ThreadPool pool, ffi::AnyBuffer a, ffi::AnyBuffer b,
                    ffi::Result<ffi::AnyBuffer> x, ffi::Result<ffi::AnyBuffer> info) {
  BATCHPART_RETURN_IF_ERROR(CheckInitialized(target));
  BATCHPART_ASSIGN_OR_RETURN(const GesvShape shape, ValidateGesv(a, b, *x, *info, target));
  return DispatchByDtype(target, a.element_type(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    return Solve<T, Order>(pool, shape, a, b, *x, *info);
  });
}

ffi::Error ColumnMajorGesv(ffi::ThreadPool pool, ffi::AnyBuffer a, ffi::AnyBuffer b,
                           ffi::Result<ffi::AnyBuffer> x, ffi::Result<ffi::AnyBuffer> info) {
  return GesvImpl<ColumnMajor>(kGesvTarget, pool, a, b, x, info);
}

ffi::Error RowMajorGesv(ffi::ThreadPool pool, ffi::AnyBuffer a, ffi::AnyBuffer b,
                        ffi::Result<ffi::AnyBuffer> x, ffi::Result<ffi::AnyBuffer> info) {
  return GesvImpl<RowMajor>(kGesvRowMajorTarget, pool, a, b, x, info);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(BatchpartGesv, ColumnMajorGesv,
                              BindGesv(ffi::Ffi::Bind().Ctx<ffi::ThreadPool>()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(BatchpartGesvRowMajor, RowMajorGesv,
                              BindGesv(ffi::Ffi::Bind().Ctx<ffi::ThreadPool>()));

}  // namespace batchpart::lapack
