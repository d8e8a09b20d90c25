// batchpart_trsm on CUDA: batched triangular solve with broadcast batch dims.
#include <cstdint>

#include "cusolver/kernels.h"
#include "cusolver/solver_api.h"

namespace batchpart::cusolver {
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
  BATCHPART_RETURN_IF_ERROR(lapack::ExpectLinalgDtype(kTarget, a.element_type()));
  BATCHPART_RETURN_IF_ERROR(lapack::ExpectSquare(kTarget, "operand a", a.dimensions()));
  BATCHPART_RETURN_IF_ERROR(lapack::ExpectMatrix(kTarget, "operand b", b.dimensions()));
  BATCHPART_RETURN_IF_ERROR(lapack::ExpectMatrix(kTarget, "result x", x.dimensions()));
  const Dims b_dims = b.dimensions();
  shape.p = a.dimensions().back();
  shape.rows = b_dims[b_dims.size() - 2];
  shape.cols = b_dims.back();
  shape.a_batch = lapack::BatchDims(a.dimensions(), 2);
  shape.b_batch = lapack::BatchDims(b_dims, 2);
  shape.x_batch = lapack::BatchDims(x.dimensions(), 2);
  if ((left_side ? shape.rows : shape.cols) != shape.p) {
    return lapack::InvalidArgument(
        kTarget, "operand b of shape " + lapack::DimsToString(b_dims) + " does not fit a of shape " +
                     lapack::DimsToString(a.dimensions()) +
                     (left_side ? " (left_side: b's rows must equal a's size)"
                                : " (right side: b's columns must equal a's size)"));
  }
  BATCHPART_RETURN_IF_ERROR(ExpectInt(kTarget, "b rows", shape.rows));
  BATCHPART_RETURN_IF_ERROR(ExpectInt(kTarget, "b columns", shape.cols));
  BATCHPART_RETURN_IF_ERROR(
      lapack::ExpectDtype(kTarget, "operand b", b.element_type(), a.element_type()));
  BATCHPART_RETURN_IF_ERROR(lapack::ExpectBuffer(kTarget, "result x", x,
                                                 lapack::WithCore(shape.x_batch, {shape.rows, shape.cols}),
                                                 a.element_type()));
  BATCHPART_RETURN_IF_ERROR(
      lapack::ExpectBroadcast(kTarget, "operand a", shape.a_batch, shape.x_batch));
  return lapack::ExpectBroadcast(kTarget, "operand b", shape.b_batch, shape.x_batch);
}

// Where an operand's batch equals the output's, its map is the identity.
ffi::Error OperandIndex(const char* what, Dims operand_batch, Dims out_batch, int64_t count,
                        BroadcastIndex* index) {
  if (lapack::Product(operand_batch) == count) {
    *index = IdentityIndex(count);
    return ffi::Error::Success();
  }
  return MakeBroadcastIndex(kTarget, what, out_batch, operand_batch, index);
}

template <typename T>
ffi::Error Solve(cudaStream_t stream, ffi::ScratchAllocator& scratch, const TrsmShape& shape,
                 const TrsmOptions& o, const ffi::AnyBuffer& a, const ffi::AnyBuffer& b,
                 ffi::AnyBuffer& x) {
  const int64_t batch = lapack::Product(shape.x_batch), x_size = shape.rows * shape.cols;
  if (batch == 0 || x_size == 0) return ffi::Error::Success();
  T* x_data = Data<T>(x);
  T* a_data = Data<T>(a);

  // X starts as B, broadcast over the output batch.
  BroadcastIndex a_index, b_index;
  BATCHPART_RETURN_IF_ERROR(OperandIndex("operand a", shape.a_batch, shape.x_batch, batch, &a_index));
  BATCHPART_RETURN_IF_ERROR(OperandIndex("operand b", shape.b_batch, shape.x_batch, batch, &b_index));
  if (lapack::Product(shape.b_batch) == batch) {
    BATCHPART_RETURN_IF_ERROR(CopyIfDistinct(kTarget, stream, Data<T>(b), x_data, batch * x_size));
  } else {
    BATCHPART_RETURN_IF_ERROR(CudaStatus(
        kTarget, "BroadcastCopy", BroadcastCopy(stream, Data<T>(b), x_size, b_index, batch, x_data)));
  }

  // cuBLAS has no "conjugate, don't transpose": conj(A) X = B is solved as
  // A conj(X) = conj(B).
  const bool conjugate_only = kIsComplex<T> && o.conjugate_a && !o.transpose_a;
  if (conjugate_only) {
    BATCHPART_RETURN_IF_ERROR(
        CudaStatus(kTarget, "Conjugate", Conjugate(stream, x_data, batch * x_size)));
  }
  BlasHandle handle;
  BATCHPART_RETURN_IF_ERROR(BorrowBlas(kTarget, stream, &handle));
  const cublasSideMode_t side = o.left_side ? CUBLAS_SIDE_LEFT : CUBLAS_SIDE_RIGHT;
  const cublasFillMode_t uplo = o.lower ? CUBLAS_FILL_MODE_LOWER : CUBLAS_FILL_MODE_UPPER;
  const cublasOperation_t trans =
      !o.transpose_a ? CUBLAS_OP_N : (o.conjugate_a && kIsComplex<T> ? CUBLAS_OP_C : CUBLAS_OP_T);
  const cublasDiagType_t diag = o.unit_diagonal ? CUBLAS_DIAG_UNIT : CUBLAS_DIAG_NON_UNIT;
  const int rows = static_cast<int>(shape.rows), cols = static_cast<int>(shape.cols);
  const int lda = static_cast<int>(std::max<int64_t>(1, shape.p));
  const int ldb = static_cast<int>(std::max<int64_t>(1, shape.rows));
  const T alpha = HostOne<T>();  // host pointer mode (cuBLAS's default)
  if (batch == 1) {
    BATCHPART_RETURN_IF_ERROR(BlasStatus(
        kTarget, "trsm",
        Solver<T>::trsm(handle.get(), side, uplo, trans, diag, rows, cols, &alpha, a_data, lda,
                        x_data, ldb)));
  } else {
    T **a_ptrs, **x_ptrs;
    BATCHPART_RETURN_IF_ERROR(Allocate(scratch, kTarget, "pointer array", batch, &a_ptrs));
    BATCHPART_RETURN_IF_ERROR(Allocate(scratch, kTarget, "pointer array", batch, &x_ptrs));
    BATCHPART_RETURN_IF_ERROR(CudaStatus(
        kTarget, "MakePointers",
        MakePointers(stream, a_data, shape.p * shape.p, a_index, batch, a_ptrs)));
    BATCHPART_RETURN_IF_ERROR(CudaStatus(
        kTarget, "MakePointers",
        MakePointers(stream, x_data, x_size, IdentityIndex(batch), batch, x_ptrs)));
    BATCHPART_RETURN_IF_ERROR(ForEachBatchChunk(batch, [&](int64_t begin, int count) {
      return BlasStatus(kTarget, "trsmBatched",
                        Solver<T>::trsmBatched(handle.get(), side, uplo, trans, diag, rows, cols,
                                               &alpha, a_ptrs + begin, lda, x_ptrs + begin, ldb,
                                               count));
    }));
  }
  if (conjugate_only) {
    BATCHPART_RETURN_IF_ERROR(
        CudaStatus(kTarget, "Conjugate", Conjugate(stream, x_data, batch * x_size)));
  }
  return ffi::Error::Success();
}

ffi::Error TrsmImpl(cudaStream_t stream, ffi::ScratchAllocator scratch, ffi::AnyBuffer a,
                    ffi::AnyBuffer b, ffi::Result<ffi::AnyBuffer> x, bool left_side, bool lower,
                    bool transpose_a, bool conjugate_a, bool unit_diagonal) {
  TrsmShape shape;
  BATCHPART_RETURN_IF_ERROR(Validate(a, b, *x, left_side, shape));
  const TrsmOptions options{left_side, lower, transpose_a, conjugate_a, unit_diagonal};
  return DispatchByDtype(kTarget, a.element_type(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    return Solve<T>(stream, scratch, shape, options, a, b, *x);
  });
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(BatchpartTrsmCuda, TrsmImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::ScratchAllocator>()
                                  .Arg<ffi::AnyBuffer>()  // a
                                  .Arg<ffi::AnyBuffer>()  // b
                                  .Ret<ffi::AnyBuffer>()  // x
                                  .Attr<bool>("left_side")
                                  .Attr<bool>("lower")
                                  .Attr<bool>("transpose_a")
                                  .Attr<bool>("conjugate_a")
                                  .Attr<bool>("unit_diagonal"));

}  // namespace batchpart::cusolver
