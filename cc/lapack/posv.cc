// batchpart_posv: batched Hermitian positive-definite solve (potrf + potrs)
// with broadcast batch dims; contract in option_kernels.h.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/batch_broadcast.h"
#include "common/contracts.h"
#include "lapack/batch_loop.h"
#include "lapack/group_loop.h"
#include "lapack/kernel_helpers.h"
#include "lapack/kernel_steps.h"
#include "lapack/option_kernels.h"
#include "lapack/small_cholesky.h"

namespace batchpart::lapack {
namespace {

constexpr char kTarget[] = "batchpart_posv";

// A chunk's Cholesky factor of the A it factored last: consecutive batch
// elements that share a broadcast A factor it once.
template <typename T>
struct FactorCache {
  explicit FactorCache(int64_t n) : factor(n * n) {}
  AlignedVector<T> factor;
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
  cache.info = info != 0 ? info : FirstNaNPivot(cache.factor.data(), n_);
}

// The same for small matrices, kLanes<T> batch elements at a time
// (small_cholesky.h): each lane packs its own A and B, broadcast ones
// included, and a group of a few elements solves them one by one, with the
// same bits. The upper triangle is read by packing A transposed, whose lower
// factor is conj(L) for A = L L^H.
template <typename T>
ffi::Error SolveInterleaved(ffi::ThreadPool& pool, const GesvShape& shape, bool lower,
                            const ffi::AnyBuffer& a, const ffi::AnyBuffer& b, ffi::AnyBuffer& x,
                            ffi::AnyBuffer& info) {
  namespace il = interleaved;
  constexpr int64_t W = il::kLanes<T>;
  const BatchBroadcast a_index(shape.x_batch, shape.a_batch);
  const BatchBroadcast b_index(shape.x_batch, shape.b_batch);
  const int64_t n = shape.n, r = shape.nrhs, a_size = n * n, x_size = n * r;
  const int64_t batch = Product(shape.x_batch);
  const T* a_data = a.typed_data<T>();
  const T* b_data = b.typed_data<T>();
  T* x_data = x.typed_data<T>();
  int32_t* info_data = info.typed_data<int32_t>();
  const il::Strides a_strides = lower ? il::ColumnMajor(n) : il::RowMajor(n);
  const il::Strides x_strides = il::ColumnMajor(n);
  struct Scratch {
    il::Group<T> factor, rhs;
  };
  struct OneScratch {
    il::Group<T, 1> factor, rhs;
  };
  return il::ForEachGroupOrOne<T>(
      pool, batch, kFlopScale<T> * (n * n * n / 3.0 + 2.0 * n * n * r), il::SmallCholeskyMinGroup(),
      [n, r] { return Scratch{il::Group<T>(n, n), il::Group<T>(n, r)}; },
      [&](Scratch& s, il::Lanes lanes) {
        int32_t group_info[W];
        il::PackLanes(s.factor, a_data, a_index, a_size, lanes, a_strides);
        il::FactorLower(s.factor, /*symmetrize=*/false, group_info);
        if (!lower) il::Conjugate(s.factor);
        il::PackLanes(s.rhs, b_data, b_index, x_size, lanes, x_strides);
        // A failed lane's factor is NaN, and so its solution.
        il::SolveLower(s.factor, s.rhs);
        il::UnpackLanes(s.rhs, x_data, x_size, lanes, x_strides);
        std::copy_n(group_info, lanes.count, info_data + lanes.first);
      },
      [n, r] { return OneScratch{il::Group<T, 1>(n, n), il::Group<T, 1>(r, n)}; },
      [&](OneScratch& s, il::Lanes lane) {
        il::PackLanes(s.factor, a_data, a_index, a_size, lane, il::Transposed(a_strides));
        il::FactorLowerOne(s.factor, /*symmetrize=*/false, info_data + lane.first);
        if (!lower) il::Conjugate(s.factor);
        il::PackLanes(s.rhs, b_data, b_index, x_size, lane, il::Transposed(x_strides));
        il::SolveLowerOne(s.factor, s.rhs);
        il::UnpackLanes(s.rhs, x_data, x_size, lane, il::Transposed(x_strides));
      });
}

template <typename T>
ffi::Error Solve(ffi::ThreadPool& pool, const GesvShape& shape, bool lower, const ffi::AnyBuffer& a,
                 const ffi::AnyBuffer& b, ffi::AnyBuffer& x, ffi::AnyBuffer& info) {
  const int64_t n = shape.n;
  if (shape.nrhs >= 1 && Product(shape.x_batch) >= 1 && interleaved::UseSmallPosv(n)) {
    return SolveInterleaved<T>(pool, shape, lower, a, b, x, info);
  }
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
  BATCHPART_RETURN_FOR_DTYPE(kTarget, a.element_type(), Solve, pool, shape, lower, a, b, *x, *info);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(BatchpartPosv, PosvImpl,
                              BindGesv(ffi::Ffi::Bind().Ctx<ffi::ThreadPool>())
                                  .Attr<bool>("lower"));

}  // namespace batchpart::lapack
