// batchpart_trsm and batchpart_trsm_row_major: batched triangular solve
// (small triangles many at a time in the interleaved kernel,
// small_triangular_solve.h; else BLAS trsm, or for small real left-side
// solves of row-major matrices substitution on rows) with broadcast batch
// dims, of column-major or row-major matrices.
#include <algorithm>
#include <complex>
#include <cstdint>
#include <utility>

#include "common/batch_broadcast.h"
#include "lapack/batch_loop.h"
#include "lapack/kernel_helpers.h"
#include "lapack/kernels.h"
#include "lapack/option_kernels.h"
#include "lapack/row_substitution.h"
#include "lapack/small_triangular_solve.h"

namespace batchpart::lapack {
namespace {

template <typename T>
void Conjugate(T* data, int64_t count) {
  if constexpr (kIsComplex<T>) {
    for (int64_t i = 0; i < count; ++i) data[i] = std::conj(data[i]);
  }
}

// Solves in place in x (which holds B). BLAS has no "conjugate, don't
// transpose" mode: conj(A) X = B is solved as A conj(X) = conj(B).
template <typename T>
void SolveBlas(const TrsmShape& shape, const TrsmOptions& o, const T* a, T* x) {
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

// The largest A solved by substitution on rows (row_substitution.h) instead
// of BLAS. A BLAS trsm
// call costs about 0.1 us before any arithmetic; substitution on rows beat
// it up to 16x16 (single-threaded, float32, 1 to 16 right-hand sides: 3.8x
// faster at 4x4, 2.6x at 8x8, 1.4x at 16x16; BLAS wins at 32x32).
constexpr int64_t kSubstitutionMaxSize = 16;

// Whether a row-major trsm is solved on rows: real (no conjugation to apply),
// left side, small.
template <typename T>
bool UsesRowSubstitution(const TrsmShape& shape, const TrsmOptions& options) {
  return !kIsComplex<T> && options.left_side && shape.p <= kSubstitutionMaxSize;
}

// The column-major problem that a row-major one is, on the same buffers.
// Read column-major, the row-major A and X are A^T and X^T, and
// op(A) X = B is X^T op(A)^T = B^T: the other side, the other triangle of
// A^T, and the same transpose and conjugation of it. So BLAS solves it with
// no transposed copy on either side of the kernel.
std::pair<TrsmShape, TrsmOptions> AsColumnMajor(const TrsmShape& shape, TrsmOptions options) {
  TrsmShape transposed = shape;
  std::swap(transposed.rows, transposed.cols);
  options.left_side = !options.left_side;
  options.lower = !options.lower;
  return {transposed, options};
}

// Copies each element's B into X and has solve_one(a, x) solve it in place.
template <typename T, typename SolveOne>
ffi::Error Solve(ffi::ThreadPool& pool, const TrsmShape& shape, const ffi::AnyBuffer& a,
                 const ffi::AnyBuffer& b, ffi::AnyBuffer& x, SolveOne solve_one) {
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
      solve_one(a_data + a_index(i) * a_size, xi);
    }
  });
}

ffi::Error TrsmImpl(const char* target, bool row_major, ffi::ThreadPool pool, ffi::AnyBuffer a,
                    ffi::AnyBuffer b, ffi::Result<ffi::AnyBuffer> x, bool left_side, bool lower,
                    bool transpose_a, bool conjugate_a, bool unit_diagonal) {
  BATCHPART_RETURN_IF_ERROR(CheckInitialized(target));
  BATCHPART_ASSIGN_OR_RETURN(const TrsmShape shape, ValidateTrsm(a, b, *x, left_side, target));
  const TrsmOptions options{left_side, lower, transpose_a, conjugate_a, unit_diagonal};
  return DispatchByDtype(target, a.element_type(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (UsesSmallTrsm<T>(shape)) {
      return SmallTrsm<T>(pool, shape, options, row_major, a.typed_data<T>(), b.typed_data<T>(),
                          x->typed_data<T>());
    }
    if (row_major && UsesRowSubstitution<T>(shape, options)) {
      return Solve<T>(pool, shape, a, b, *x, [&](const T* ai, T* xi) {
        SubstituteOnRows(shape.p, shape.cols, ai, options.lower, options.transpose_a,
                         options.unit_diagonal, xi);
      });
    }
    const std::pair<TrsmShape, TrsmOptions> blas =
        row_major ? AsColumnMajor(shape, options) : std::make_pair(shape, options);
    return Solve<T>(pool, shape, a, b, *x,
                    [&](const T* ai, T* xi) { SolveBlas<T>(blas.first, blas.second, ai, xi); });
  });
}

ffi::Error ColumnMajorTrsm(ffi::ThreadPool pool, ffi::AnyBuffer a, ffi::AnyBuffer b,
                           ffi::Result<ffi::AnyBuffer> x, bool left_side, bool lower,
                           bool transpose_a, bool conjugate_a, bool unit_diagonal) {
  return TrsmImpl(kTrsmTarget, /*row_major=*/false, pool, a, b, x, left_side, lower, transpose_a,
                  conjugate_a, unit_diagonal);
}

ffi::Error RowMajorTrsm(ffi::ThreadPool pool, ffi::AnyBuffer a, ffi::AnyBuffer b,
                        ffi::Result<ffi::AnyBuffer> x, bool left_side, bool lower, bool transpose_a,
                        bool conjugate_a, bool unit_diagonal) {
  return TrsmImpl(kTrsmRowMajorTarget, /*row_major=*/true, pool, a, b, x, left_side, lower,
                  transpose_a, conjugate_a, unit_diagonal);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(BatchpartTrsm, ColumnMajorTrsm,
                              BindTrsm(ffi::Ffi::Bind().Ctx<ffi::ThreadPool>()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(BatchpartTrsmRowMajor, RowMajorTrsm,
                              BindTrsm(ffi::Ffi::Bind().Ctx<ffi::ThreadPool>()));

}  // namespace batchpart::lapack
