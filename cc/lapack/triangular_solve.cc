// batchpart_trsm: batched triangular solve (BLAS trsm) with broadcast batch dims.
#include <algorithm>
#include <complex>
#include <cstdint>

#include "common/batch_broadcast.h"
#include "lapack/batch_loop.h"
#include "lapack/kernel_helpers.h"
#include "lapack/kernels.h"

namespace batchpart::lapack {
namespace {

constexpr const char* kTarget = kTrsmTarget;

template <typename T>
void Conjugate(T* data, int64_t count) {
  if constexpr (kIsComplex<T>) {
    for (int64_t i = 0; i < count; ++i) data[i] = std::conj(data[i]);
  }
}

// Solves in place in x (which holds B). BLAS has no "conjugate, don't
// transpose" mode: conj(A) X = B is solved as A conj(X) = conj(B).
template <typename T>
void SolveOne(const TrsmShape& shape, const TrsmOptions& o, const T* a, T* x) {
  const bool conjugate_only = kIsComplex<T> && o.conjugate_a && !o.transpose_a;
  char side = o.left_side ? 'L' : 'R', uplo = o.lower ? 'L' : 'U';
  char trans = !o.transpose_a ? 'N' : (o.conjugate_a ? 'C' : 'T');
  char diag = o.unit_diagonal ? 'U' : 'N';
  lapack_int m = static_cast<lapack_int>(shape.rows), n = static_cast<lapack_int>(shape.cols);
  lapack_int lda = LeadingDim(shape.p), ldb = LeadingDim(shape.rows);
  T alpha(1);
  if (conjugate_only) Conjugate(x, shape.rows * shape.cols);
  Lapack<T>::trsm(&side, &uplo, &trans, &diag, &m, &n, &alpha, const_cast<T*>(a), &lda, x, &ldb);
  if (conjugate_only) Conjugate(x, shape.rows * shape.cols);
}

template <typename T>
ffi::Error Solve(ffi::ThreadPool& pool, const TrsmShape& shape, const TrsmOptions& options,
                 const ffi::AnyBuffer& a, const ffi::AnyBuffer& b, ffi::AnyBuffer& x) {
  const BatchBroadcast a_index(shape.x_batch, shape.a_batch);
  const BatchBroadcast b_index(shape.x_batch, shape.b_batch);
  const int64_t a_size = shape.p * shape.p, x_size = shape.rows * shape.cols;
  const T* a_data = a.typed_data<T>();
  const T* b_data = b.typed_data<T>();
  T* x_data = x.typed_data<T>();
  const double flops = kFlopScale<T> * shape.p * shape.rows * shape.cols;
  return ForEachBatchChunk(pool, Product(shape.x_batch), flops, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      T* xi = x_data + i * x_size;
      CopyIfDistinct(b_data + b_index(i) * x_size, xi, x_size);
      SolveOne<T>(shape, options, a_data + a_index(i) * a_size, xi);
    }
  });
}

ffi::Error TrsmImpl(ffi::ThreadPool pool, ffi::AnyBuffer a, ffi::AnyBuffer b,
                    ffi::Result<ffi::AnyBuffer> x, bool left_side, bool lower, bool transpose_a,
                    bool conjugate_a, bool unit_diagonal) {
  BATCHPART_RETURN_IF_ERROR(CheckInitialized(kTarget));
  BATCHPART_ASSIGN_OR_RETURN(const TrsmShape shape, ValidateTrsm(a, b, *x, left_side));
  const TrsmOptions options{left_side, lower, transpose_a, conjugate_a, unit_diagonal};
  return DispatchByDtype(kTarget, a.element_type(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    return Solve<T>(pool, shape, options, a, b, *x);
  });
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(BatchpartTrsm, TrsmImpl,
                              BindTrsm(ffi::Ffi::Bind().Ctx<ffi::ThreadPool>()));

}  // namespace batchpart::lapack
