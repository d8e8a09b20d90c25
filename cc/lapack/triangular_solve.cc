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

constexpr char kTarget[] = "batchpart_trsm";

struct TrsmOptions {
  bool left_side, lower, transpose_a, conjugate_a, unit_diagonal;
};

struct TrsmShape {
  Dims a_batch, b_batch, x_batch;
  int64_t p;           // A is p x p
  int64_t rows, cols;  // of B and X
};

ffi::Error Validate(const ffi::AnyBuffer& a, const ffi::AnyBuffer& b, const ffi::AnyBuffer& x,
                    bool left_side, TrsmShape& shape) {
  BATCHPART_RETURN_IF_ERROR(ExpectLinalgDtype(kTarget, a.element_type()));
  BATCHPART_RETURN_IF_ERROR(ExpectSquare(kTarget, "operand a", a.dimensions()));
  BATCHPART_RETURN_IF_ERROR(ExpectMatrix(kTarget, "operand b", b.dimensions()));
  BATCHPART_RETURN_IF_ERROR(ExpectMatrix(kTarget, "result x", x.dimensions()));
  const Dims b_dims = b.dimensions();
  shape.p = a.dimensions().back();
  shape.rows = b_dims[b_dims.size() - 2];
  shape.cols = b_dims.back();
  shape.a_batch = BatchDims(a.dimensions(), 2);
  shape.b_batch = BatchDims(b_dims, 2);
  shape.x_batch = BatchDims(x.dimensions(), 2);
  if ((left_side ? shape.rows : shape.cols) != shape.p) {
    return InvalidArgument(
        kTarget, "operand b of shape " + DimsToString(b_dims) + " does not fit a of shape " +
                     DimsToString(a.dimensions()) +
                     (left_side ? " (left_side: b's rows must equal a's size)"
                                : " (right side: b's columns must equal a's size)"));
  }
  BATCHPART_RETURN_IF_ERROR(ExpectLapackInt(kTarget, "b rows", shape.rows));
  BATCHPART_RETURN_IF_ERROR(ExpectLapackInt(kTarget, "b columns", shape.cols));
  BATCHPART_RETURN_IF_ERROR(ExpectDtype(kTarget, "operand b", b.element_type(), a.element_type()));
  BATCHPART_RETURN_IF_ERROR(ExpectBuffer(
      kTarget, "result x", x, WithCore(shape.x_batch, {shape.rows, shape.cols}), a.element_type()));
  BATCHPART_RETURN_IF_ERROR(ExpectBroadcast(kTarget, "operand a", shape.a_batch, shape.x_batch));
  return ExpectBroadcast(kTarget, "operand b", shape.b_batch, shape.x_batch);
}

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
  TrsmShape shape;
  BATCHPART_RETURN_IF_ERROR(Validate(a, b, *x, left_side, shape));
  const TrsmOptions options{left_side, lower, transpose_a, conjugate_a, unit_diagonal};
  return DispatchByDtype(kTarget, a.element_type(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    return Solve<T>(pool, shape, options, a, b, *x);
  });
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(BatchpartTrsm, TrsmImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()  // a
                                  .Arg<ffi::AnyBuffer>()  // b
                                  .Ret<ffi::AnyBuffer>()  // x
                                  .Attr<bool>("left_side")
                                  .Attr<bool>("lower")
                                  .Attr<bool>("transpose_a")
                                  .Attr<bool>("conjugate_a")
                                  .Attr<bool>("unit_diagonal"));

}  // namespace batchpart::lapack
