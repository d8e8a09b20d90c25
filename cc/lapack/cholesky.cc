// batchpart_potrf: batched Cholesky factorization (LAPACK potrf).
#include <algorithm>
#include <cstdint>

#include "lapack/batch_loop.h"
#include "lapack/group_loop.h"
#include "lapack/kernel_helpers.h"
#include "lapack/kernels.h"
#include "lapack/small_cholesky.h"

namespace batchpart::lapack {
namespace {

constexpr const char* kTarget = kPotrfTarget;

// Factors one matrix in place. A matrix that is not positive definite
// (including one holding NaNs: a NaN pivot fails, FirstNaNPivot) becomes all NaN,
// so the failure cannot pass for a result.
template <typename T>
void FactorOne(int64_t n, bool lower, bool symmetrize, T* l, int32_t* info) {
  if (symmetrize) SymmetrizeTriangle(l, n, lower);
  char uplo = lower ? 'L' : 'U';
  lapack_int n_v = static_cast<lapack_int>(n), lda = LeadingDim(n), info_v = 0;
  Lapack<T>::potrf(&uplo, &n_v, l, &lda, &info_v);
  *info = info_v != 0 ? info_v : FirstNaNPivot(l, n);
  if (*info != 0) {
    FillNaN(l, n * n);
  } else {
    ZeroOtherTriangle(l, n, lower);
  }
}

// The same for small matrices, kLanes<T> at a time (small_cholesky.h): the
// pool's chunks are whole groups, and a group of a few matrices factors them
// one by one, with the same bits. The upper factor is the transposed pack's
// lower one, read back transposed.
template <typename T>
ffi::Error FactorInterleaved(ffi::ThreadPool& pool, int64_t batch, int64_t n, bool lower,
                             bool symmetrize, const T* a_data, T* l_data, int32_t* info_data) {
  namespace il = interleaved;
  constexpr int64_t W = il::kLanes<T>;
  const int64_t size = n * n;
  const il::Strides strides = lower ? il::ColumnMajor(n) : il::RowMajor(n);
  return il::ForEachGroupOrOne<T>(
      pool, batch, kFlopScale<T> * n * n * n / 3.0, il::SmallCholeskyMinGroup(),
      [n] { return il::Group<T>(n, n); },
      [&](il::Group<T>& group, il::Lanes lanes) {
        int32_t group_info[W];
        il::PackLanes(group, a_data, il::Itself, size, lanes, strides);
        il::FactorLower(group, symmetrize, group_info);
        il::UnpackLanes(group, l_data, size, lanes, strides);
        std::copy_n(group_info, lanes.count, info_data + lanes.first);
      },
      [n] { return il::Group<T, 1>(n, n); },
      [&](il::Group<T, 1>& one, il::Lanes lane) {
        il::PackLanes(one, a_data, il::Itself, size, lane, il::Transposed(strides));
        il::FactorLowerOne(one, symmetrize, info_data + lane.first);
        il::UnpackLanes(one, l_data, size, lane, il::Transposed(strides));
      });
}

template <typename T>
ffi::Error Factor(ffi::ThreadPool& pool, const CholeskyShape& shape, bool lower, bool symmetrize,
                  const ffi::AnyBuffer& a, ffi::AnyBuffer& factor, ffi::AnyBuffer& info) {
  const int64_t n = shape.n, size = n * n, batch = Product(shape.batch);
  const T* a_data = a.typed_data<T>();
  T* l_data = factor.typed_data<T>();
  int32_t* info_data = info.typed_data<int32_t>();
  if (interleaved::UseSmallCholesky(n)) {
    return FactorInterleaved<T>(pool, batch, n, lower, symmetrize, a_data, l_data, info_data);
  }
  const double flops = kFlopScale<T> * n * n * n / 3.0;
  return ForEachBatchChunk(pool, batch, flops, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      CopyIfDistinct(a_data + b * size, l_data + b * size, size);
      FactorOne<T>(n, lower, symmetrize, l_data + b * size, info_data + b);
    }
  });
}

ffi::Error PotrfImpl(ffi::ThreadPool pool, ffi::AnyBuffer a, ffi::Result<ffi::AnyBuffer> factor,
                     ffi::Result<ffi::AnyBuffer> info, bool lower, bool symmetrize) {
  BATCHPART_RETURN_IF_ERROR(CheckInitialized(kTarget));
  BATCHPART_ASSIGN_OR_RETURN(const CholeskyShape shape, ValidatePotrf(a, *factor, *info));
  BATCHPART_RETURN_FOR_DTYPE(kTarget, a.element_type(), Factor, pool, shape, lower, symmetrize, a,
                             *factor, *info);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(BatchpartPotrf, PotrfImpl,
                              BindPotrf(ffi::Ffi::Bind().Ctx<ffi::ThreadPool>()));

}  // namespace batchpart::lapack
