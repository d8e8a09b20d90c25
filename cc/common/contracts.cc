#include "common/contracts.h"

#include <algorithm>
#include <string>

namespace batchpart {
namespace {

// Runs `check(shape)`, which fills the shape and reports the first mismatch.
template <typename Shape, typename Check>
ffi::ErrorOr<Shape> Validated(Check&& check) {
  Shape shape{};
  ffi::Error error = check(shape);
  if (error.failure()) return ffi::Unexpected<ffi::Error>(std::move(error));
  return shape;
}

// The batch dims and last two dims of a matrix operand already checked by
// ExpectMatrix.
struct MatrixDims {
  Dims batch;
  int64_t rows, cols;
};
MatrixDims SplitMatrix(Dims dims) {
  return {BatchDims(dims, 2), dims[dims.size() - 2], dims.back()};
}

}  // namespace

ffi::ErrorOr<CholeskyShape> ValidatePotrf(const ffi::AnyBuffer& a, const ffi::AnyBuffer& factor,
                                          const ffi::AnyBuffer& info) {
  constexpr const char* kTarget = kPotrfTarget;
  return Validated<CholeskyShape>([&](CholeskyShape& shape) -> ffi::Error {
    BATCHPART_RETURN_IF_ERROR(ExpectLinalgDtype(kTarget, a.element_type()));
    BATCHPART_RETURN_IF_ERROR(ExpectSquare(kTarget, "operand a", a.dimensions()));
    shape.batch = BatchDims(a.dimensions(), 2);
    shape.n = a.dimensions().back();
    BATCHPART_RETURN_IF_ERROR(ExpectInt32(kTarget, "n", shape.n));
    BATCHPART_RETURN_IF_ERROR(ExpectBuffer(kTarget, "result factor", factor,
                                           WithCore(shape.batch, {shape.n, shape.n}),
                                           a.element_type()));
    return ExpectBuffer(kTarget, "result info", info, WithCore(shape.batch, {}),
                        ffi::DataType::S32);
  });
}

ffi::ErrorOr<LuShape> ValidateGetrf(const ffi::AnyBuffer& a, const ffi::AnyBuffer& lu,
                                    const ffi::AnyBuffer& pivots, const ffi::AnyBuffer& perm,
                                    const ffi::AnyBuffer& info) {
  constexpr const char* kTarget = kGetrfTarget;
  return Validated<LuShape>([&](LuShape& shape) -> ffi::Error {
    BATCHPART_RETURN_IF_ERROR(ExpectLinalgDtype(kTarget, a.element_type()));
    BATCHPART_RETURN_IF_ERROR(ExpectMatrix(kTarget, "operand a", a.dimensions()));
    const MatrixDims dims = SplitMatrix(a.dimensions());
    shape.batch = dims.batch;
    shape.m = dims.rows;
    shape.n = dims.cols;
    shape.k = std::min(shape.m, shape.n);
    BATCHPART_RETURN_IF_ERROR(ExpectInt32(kTarget, "m", shape.m));
    BATCHPART_RETURN_IF_ERROR(ExpectInt32(kTarget, "n", shape.n));
    BATCHPART_RETURN_IF_ERROR(ExpectBuffer(
        kTarget, "result lu", lu, WithCore(shape.batch, {shape.m, shape.n}), a.element_type()));
    BATCHPART_RETURN_IF_ERROR(ExpectBuffer(kTarget, "result pivots", pivots,
                                           WithCore(shape.batch, {shape.k}), ffi::DataType::S32));
    BATCHPART_RETURN_IF_ERROR(ExpectBuffer(kTarget, "result permutation", perm,
                                           WithCore(shape.batch, {shape.m}), ffi::DataType::S32));
    return ExpectBuffer(kTarget, "result info", info, WithCore(shape.batch, {}),
                        ffi::DataType::S32);
  });
}

ffi::ErrorOr<QrShape> ValidateQr(const ffi::AnyBuffer& a, const ffi::AnyBuffer& q,
                                 const ffi::AnyBuffer& r, bool full_matrices) {
  constexpr const char* kTarget = kQrTarget;
  return Validated<QrShape>([&](QrShape& shape) -> ffi::Error {
    BATCHPART_RETURN_IF_ERROR(ExpectLinalgDtype(kTarget, a.element_type()));
    BATCHPART_RETURN_IF_ERROR(ExpectMatrix(kTarget, "operand a", a.dimensions()));
    const MatrixDims dims = SplitMatrix(a.dimensions());
    shape.batch = dims.batch;
    shape.m = dims.rows;
    shape.n = dims.cols;
    shape.k = std::min(shape.m, shape.n);
    shape.q_cols = shape.r_rows = full_matrices ? shape.m : shape.k;
    BATCHPART_RETURN_IF_ERROR(ExpectInt32(kTarget, "m", shape.m));
    BATCHPART_RETURN_IF_ERROR(ExpectInt32(kTarget, "n", shape.n));
    BATCHPART_RETURN_IF_ERROR(ExpectBuffer(
        kTarget, "result q", q, WithCore(shape.batch, {shape.m, shape.q_cols}), a.element_type()));
    return ExpectBuffer(kTarget, "result r", r, WithCore(shape.batch, {shape.r_rows, shape.n}),
                        a.element_type());
  });
}

ffi::ErrorOr<EighShape> ValidateEigh(const ffi::AnyBuffer& a, const ffi::AnyBuffer& w,
                                     const ffi::AnyBuffer& v, const ffi::AnyBuffer& info,
                                     bool compute_vectors) {
  constexpr const char* kTarget = kEighTarget;
  return Validated<EighShape>([&](EighShape& shape) -> ffi::Error {
    BATCHPART_RETURN_IF_ERROR(ExpectLinalgDtype(kTarget, a.element_type()));
    BATCHPART_RETURN_IF_ERROR(ExpectSquare(kTarget, "operand a", a.dimensions()));
    shape.batch = BatchDims(a.dimensions(), 2);
    shape.n = a.dimensions().back();
    shape.v_cols = compute_vectors ? shape.n : 0;
    BATCHPART_RETURN_IF_ERROR(ExpectInt32(kTarget, "n", shape.n));
    BATCHPART_RETURN_IF_ERROR(ExpectBuffer(kTarget, "result eigenvalues", w,
                                           WithCore(shape.batch, {shape.n}),
                                           RealDtype(a.element_type())));
    BATCHPART_RETURN_IF_ERROR(ExpectBuffer(kTarget, "result eigenvectors", v,
                                           WithCore(shape.batch, {shape.n, shape.v_cols}),
                                           a.element_type()));
    return ExpectBuffer(kTarget, "result info", info, WithCore(shape.batch, {}),
                        ffi::DataType::S32);
  });
}

ffi::ErrorOr<SvdShape> ValidateSvd(const ffi::AnyBuffer& a, const ffi::AnyBuffer& s,
                                   const ffi::AnyBuffer& u, const ffi::AnyBuffer& vt,
                                   const ffi::AnyBuffer& info, bool full_matrices,
                                   bool compute_uv) {
  constexpr const char* kTarget = kSvdTarget;
  return Validated<SvdShape>([&](SvdShape& shape) -> ffi::Error {
    BATCHPART_RETURN_IF_ERROR(ExpectLinalgDtype(kTarget, a.element_type()));
    BATCHPART_RETURN_IF_ERROR(ExpectMatrix(kTarget, "operand a", a.dimensions()));
    const MatrixDims dims = SplitMatrix(a.dimensions());
    shape.batch = dims.batch;
    shape.m = dims.rows;
    shape.n = dims.cols;
    shape.k = std::min(shape.m, shape.n);
    shape.u_cols = !compute_uv ? 0 : full_matrices ? shape.m : shape.k;
    shape.vt_rows = !compute_uv ? 0 : full_matrices ? shape.n : shape.k;
    shape.compute_uv = compute_uv;
    shape.full_matrices = full_matrices;
    BATCHPART_RETURN_IF_ERROR(ExpectInt32(kTarget, "m", shape.m));
    BATCHPART_RETURN_IF_ERROR(ExpectInt32(kTarget, "n", shape.n));
    const ffi::DataType dtype = a.element_type();
    BATCHPART_RETURN_IF_ERROR(
        ExpectBuffer(kTarget, "result s", s, WithCore(shape.batch, {shape.k}), RealDtype(dtype)));
    BATCHPART_RETURN_IF_ERROR(ExpectBuffer(kTarget, "result u", u,
                                           WithCore(shape.batch, {shape.m, shape.u_cols}), dtype));
    BATCHPART_RETURN_IF_ERROR(ExpectBuffer(kTarget, "result vt", vt,
                                           WithCore(shape.batch, {shape.vt_rows, shape.n}), dtype));
    return ExpectBuffer(kTarget, "result info", info, WithCore(shape.batch, {}),
                        ffi::DataType::S32);
  });
}

ffi::ErrorOr<TrsmShape> ValidateTrsm(const ffi::AnyBuffer& a, const ffi::AnyBuffer& b,
                                     const ffi::AnyBuffer& x, bool left_side) {
  constexpr const char* kTarget = kTrsmTarget;
  return Validated<TrsmShape>([&](TrsmShape& shape) -> ffi::Error {
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
    BATCHPART_RETURN_IF_ERROR(ExpectInt32(kTarget, "b rows", shape.rows));
    BATCHPART_RETURN_IF_ERROR(ExpectInt32(kTarget, "b columns", shape.cols));
    BATCHPART_RETURN_IF_ERROR(
        ExpectDtype(kTarget, "operand b", b.element_type(), a.element_type()));
    BATCHPART_RETURN_IF_ERROR(ExpectBuffer(kTarget, "result x", x,
                                           WithCore(shape.x_batch, {shape.rows, shape.cols}),
                                           a.element_type()));
    BATCHPART_RETURN_IF_ERROR(
        ExpectBroadcast(kTarget, "operand a", shape.a_batch, shape.x_batch));
    return ExpectBroadcast(kTarget, "operand b", shape.b_batch, shape.x_batch);
  });
}

ffi::ErrorOr<GesvShape> ValidateGesv(const ffi::AnyBuffer& a, const ffi::AnyBuffer& b,
                                     const ffi::AnyBuffer& x, const ffi::AnyBuffer& info) {
  constexpr const char* kTarget = kGesvTarget;
  return Validated<GesvShape>([&](GesvShape& shape) -> ffi::Error {
    BATCHPART_RETURN_IF_ERROR(ExpectLinalgDtype(kTarget, a.element_type()));
    BATCHPART_RETURN_IF_ERROR(ExpectSquare(kTarget, "operand a", a.dimensions()));
    BATCHPART_RETURN_IF_ERROR(ExpectMatrix(kTarget, "operand b", b.dimensions()));
    BATCHPART_RETURN_IF_ERROR(ExpectMatrix(kTarget, "result x", x.dimensions()));
    const Dims b_dims = b.dimensions();
    shape.n = a.dimensions().back();
    shape.nrhs = b_dims.back();
    shape.a_batch = BatchDims(a.dimensions(), 2);
    shape.b_batch = BatchDims(b_dims, 2);
    shape.x_batch = BatchDims(x.dimensions(), 2);
    if (b_dims[b_dims.size() - 2] != shape.n) {
      return InvalidArgument(kTarget, "operand b of shape " + DimsToString(b_dims) +
                                          " does not fit a of shape " +
                                          DimsToString(a.dimensions()) +
                                          " (b's rows must equal a's size)");
    }
    BATCHPART_RETURN_IF_ERROR(ExpectInt32(kTarget, "n", shape.n));
    BATCHPART_RETURN_IF_ERROR(ExpectInt32(kTarget, "b columns", shape.nrhs));
    BATCHPART_RETURN_IF_ERROR(
        ExpectDtype(kTarget, "operand b", b.element_type(), a.element_type()));
    BATCHPART_RETURN_IF_ERROR(ExpectBuffer(
        kTarget, "result x", x, WithCore(shape.x_batch, {shape.n, shape.nrhs}), a.element_type()));
    BATCHPART_RETURN_IF_ERROR(ExpectBuffer(kTarget, "result info", info,
                                           WithCore(shape.x_batch, {}), ffi::DataType::S32));
    BATCHPART_RETURN_IF_ERROR(
        ExpectBroadcast(kTarget, "operand a", shape.a_batch, shape.x_batch));
    return ExpectBroadcast(kTarget, "operand b", shape.b_batch, shape.x_batch);
  });
}

}  // namespace batchpart
