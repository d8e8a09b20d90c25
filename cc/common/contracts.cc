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

// The int32 info result, one per batch element.
ffi::Error ExpectInfo(const char* target, const ffi::AnyBuffer& info, Dims batch) {
  return ExpectBuffer(target, "result info", info, WithCore(batch, {}), ffi::DataType::S32);
}

// Operands a (square) and b and result x of a solve: dtype and ranks, and
// their batch dims.
ffi::Error ExpectSolveOperands(const char* target, const ffi::AnyBuffer& a, const ffi::AnyBuffer& b,
                               const ffi::AnyBuffer& x, Dims& a_batch, Dims& b_batch,
                               Dims& x_batch) {
  BATCHPART_RETURN_IF_ERROR(ExpectLinalgDtype(target, a.element_type()));
  BATCHPART_RETURN_IF_ERROR(ExpectSquare(target, "operand a", a.dimensions()));
  BATCHPART_RETURN_IF_ERROR(ExpectMatrix(target, "operand b", b.dimensions()));
  BATCHPART_RETURN_IF_ERROR(ExpectMatrix(target, "result x", x.dimensions()));
  a_batch = BatchDims(a.dimensions(), 2);
  b_batch = BatchDims(b.dimensions(), 2);
  x_batch = BatchDims(x.dimensions(), 2);
  return ffi::Error::Success();
}

ffi::Error BDoesNotFit(const char* target, const ffi::AnyBuffer& a, const ffi::AnyBuffer& b,
                       const char* rule) {
  return InvalidArgument(target, "operand b of shape " + DimsToString(b.dimensions()) +
                                     " does not fit a of shape " + DimsToString(a.dimensions()) +
                                     " (" + rule + ")");
}

// Operand b's dtype and result x of a solve, and that both operands'
// batch dims broadcast to x's. `info`, where the target has one, is checked
// between x and the broadcasts.
ffi::Error ExpectSolveResults(const char* target, const ffi::AnyBuffer& a, const ffi::AnyBuffer& b,
                              const ffi::AnyBuffer& x, const ffi::AnyBuffer* info, Dims a_batch,
                              Dims b_batch, Dims x_batch, int64_t rows, int64_t cols) {
  BATCHPART_RETURN_IF_ERROR(ExpectDtype(target, "operand b", b.element_type(), a.element_type()));
  BATCHPART_RETURN_IF_ERROR(
      ExpectBuffer(target, "result x", x, WithCore(x_batch, {rows, cols}), a.element_type()));
  if (info != nullptr) BATCHPART_RETURN_IF_ERROR(ExpectInfo(target, *info, x_batch));
  BATCHPART_RETURN_IF_ERROR(ExpectBroadcast(target, "operand a", a_batch, x_batch));
  return ExpectBroadcast(target, "operand b", b_batch, x_batch);
}

}  // namespace

ffi::Error ExpectOperandA(const char* target, const ffi::AnyBuffer& a, bool square,
                          MatrixDims& dims) {
  const Dims a_dims = a.dimensions();
  BATCHPART_RETURN_IF_ERROR(ExpectLinalgDtype(target, a.element_type()));
  BATCHPART_RETURN_IF_ERROR(square ? ExpectSquare(target, "operand a", a_dims)
                                   : ExpectMatrix(target, "operand a", a_dims));
  dims = {BatchDims(a_dims, 2), a_dims[a_dims.size() - 2], a_dims.back()};
  if (square) return ExpectInt32(target, "n", dims.cols);
  BATCHPART_RETURN_IF_ERROR(ExpectInt32(target, "m", dims.rows));
  return ExpectInt32(target, "n", dims.cols);
}

ffi::ErrorOr<CholeskyShape> ValidatePotrf(const ffi::AnyBuffer& a, const ffi::AnyBuffer& factor,
                                          const ffi::AnyBuffer& info) {
  constexpr const char* kTarget = kPotrfTarget;
  return Validated<CholeskyShape>([&](CholeskyShape& shape) -> ffi::Error {
    MatrixDims dims;
    BATCHPART_RETURN_IF_ERROR(ExpectOperandA(kTarget, a, /*square=*/true, dims));
    shape = {dims.batch, dims.cols};
    BATCHPART_RETURN_IF_ERROR(ExpectBuffer(kTarget, "result factor", factor,
                                           WithCore(shape.batch, {shape.n, shape.n}),
                                           a.element_type()));
    return ExpectInfo(kTarget, info, shape.batch);
  });
}

ffi::ErrorOr<LuShape> ValidateGetrf(const ffi::AnyBuffer& a, const ffi::AnyBuffer& lu,
                                    const ffi::AnyBuffer& pivots, const ffi::AnyBuffer& perm,
                                    const ffi::AnyBuffer& info, const char* target) {
  const char* const kTarget = target;
  return Validated<LuShape>([&](LuShape& shape) -> ffi::Error {
    MatrixDims dims;
    BATCHPART_RETURN_IF_ERROR(ExpectOperandA(kTarget, a, /*square=*/false, dims));
    shape = {dims.batch, dims.rows, dims.cols, std::min(dims.rows, dims.cols)};
    BATCHPART_RETURN_IF_ERROR(ExpectBuffer(
        kTarget, "result lu", lu, WithCore(shape.batch, {shape.m, shape.n}), a.element_type()));
    BATCHPART_RETURN_IF_ERROR(ExpectBuffer(kTarget, "result pivots", pivots,
                                           WithCore(shape.batch, {shape.k}), ffi::DataType::S32));
    BATCHPART_RETURN_IF_ERROR(ExpectBuffer(kTarget, "result permutation", perm,
                                           WithCore(shape.batch, {shape.m}), ffi::DataType::S32));
    return ExpectInfo(kTarget, info, shape.batch);
  });
}

ffi::ErrorOr<QrShape> ValidateQr(const ffi::AnyBuffer& a, const ffi::AnyBuffer& q,
                                 const ffi::AnyBuffer& r, bool full_matrices, const char* target) {
  return Validated<QrShape>([&](QrShape& shape) -> ffi::Error {
    MatrixDims dims;
    BATCHPART_RETURN_IF_ERROR(ExpectOperandA(target, a, /*square=*/false, dims));
    const int64_t k = std::min(dims.rows, dims.cols), kept = full_matrices ? dims.rows : k;
    shape = {dims.batch, dims.rows, dims.cols, k, /*q_cols=*/kept, /*r_rows=*/kept};
    BATCHPART_RETURN_IF_ERROR(ExpectBuffer(
        target, "result q", q, WithCore(shape.batch, {shape.m, shape.q_cols}), a.element_type()));
    return ExpectBuffer(target, "result r", r, WithCore(shape.batch, {shape.r_rows, shape.n}),
                        a.element_type());
  });
}

ffi::ErrorOr<EighShape> ValidateEigh(const ffi::AnyBuffer& a, const ffi::AnyBuffer& w,
                                     const ffi::AnyBuffer& v, const ffi::AnyBuffer& info,
                                     bool compute_vectors) {
  constexpr const char* kTarget = kEighTarget;
  return Validated<EighShape>([&](EighShape& shape) -> ffi::Error {
    MatrixDims dims;
    BATCHPART_RETURN_IF_ERROR(ExpectOperandA(kTarget, a, /*square=*/true, dims));
    shape = {dims.batch, dims.cols, /*v_cols=*/compute_vectors ? dims.cols : 0};
    BATCHPART_RETURN_IF_ERROR(ExpectBuffer(kTarget, "result eigenvalues", w,
                                           WithCore(shape.batch, {shape.n}),
                                           RealDtype(a.element_type())));
    BATCHPART_RETURN_IF_ERROR(ExpectBuffer(kTarget, "result eigenvectors", v,
                                           WithCore(shape.batch, {shape.n, shape.v_cols}),
                                           a.element_type()));
    return ExpectInfo(kTarget, info, shape.batch);
  });
}

ffi::ErrorOr<SvdShape> ValidateSvd(const ffi::AnyBuffer& a, const ffi::AnyBuffer& s,
                                   const ffi::AnyBuffer& u, const ffi::AnyBuffer& vt,
                                   const ffi::AnyBuffer& info, bool full_matrices,
                                   bool compute_uv, const char* target) {
  const char* const kTarget = target;
  return Validated<SvdShape>([&](SvdShape& shape) -> ffi::Error {
    MatrixDims dims;
    BATCHPART_RETURN_IF_ERROR(ExpectOperandA(kTarget, a, /*square=*/false, dims));
    const int64_t m = dims.rows, n = dims.cols, k = std::min(m, n);
    shape.batch = dims.batch;
    shape.m = m;
    shape.n = n;
    shape.k = k;
    shape.u_cols = compute_uv ? (full_matrices ? m : k) : 0;
    shape.vt_rows = compute_uv ? (full_matrices ? n : k) : 0;
    shape.compute_uv = compute_uv;
    shape.full_matrices = full_matrices;
    const ffi::DataType dtype = a.element_type();
    BATCHPART_RETURN_IF_ERROR(
        ExpectBuffer(kTarget, "result s", s, WithCore(shape.batch, {k}), RealDtype(dtype)));
    BATCHPART_RETURN_IF_ERROR(
        ExpectBuffer(kTarget, "result u", u, WithCore(shape.batch, {m, shape.u_cols}), dtype));
    BATCHPART_RETURN_IF_ERROR(
        ExpectBuffer(kTarget, "result vt", vt, WithCore(shape.batch, {shape.vt_rows, n}), dtype));
    return ExpectInfo(kTarget, info, shape.batch);
  });
}

ffi::ErrorOr<TrsmShape> ValidateTrsm(const ffi::AnyBuffer& a, const ffi::AnyBuffer& b,
                                     const ffi::AnyBuffer& x, bool left_side, const char* target) {
  const char* const kTarget = target;
  return Validated<TrsmShape>([&](TrsmShape& shape) -> ffi::Error {
    BATCHPART_RETURN_IF_ERROR(
        ExpectSolveOperands(kTarget, a, b, x, shape.a_batch, shape.b_batch, shape.x_batch));
    const Dims b_dims = b.dimensions();
    shape.p = a.dimensions().back();
    shape.rows = b_dims[b_dims.size() - 2];
    shape.cols = b_dims.back();
    if ((left_side ? shape.rows : shape.cols) != shape.p) {
      return BDoesNotFit(kTarget, a, b,
                         left_side ? "left_side: b's rows must equal a's size"
                                   : "right side: b's columns must equal a's size");
    }
    BATCHPART_RETURN_IF_ERROR(ExpectInt32(kTarget, "b rows", shape.rows));
    BATCHPART_RETURN_IF_ERROR(ExpectInt32(kTarget, "b columns", shape.cols));
    return ExpectSolveResults(kTarget, a, b, x, /*info=*/nullptr, shape.a_batch, shape.b_batch,
                              shape.x_batch, shape.rows, shape.cols);
  });
}

ffi::ErrorOr<GesvShape> ValidateGesv(const ffi::AnyBuffer& a, const ffi::AnyBuffer& b,
                                     const ffi::AnyBuffer& x, const ffi::AnyBuffer& info,
                                     const char* target) {
  const char* const kTarget = target;
  return Validated<GesvShape>([&](GesvShape& shape) -> ffi::Error {
    BATCHPART_RETURN_IF_ERROR(
        ExpectSolveOperands(kTarget, a, b, x, shape.a_batch, shape.b_batch, shape.x_batch));
    const Dims b_dims = b.dimensions();
    shape.n = a.dimensions().back();
    shape.nrhs = b_dims.back();
    if (b_dims[b_dims.size() - 2] != shape.n) {
      return BDoesNotFit(kTarget, a, b, "b's rows must equal a's size");
    }
    BATCHPART_RETURN_IF_ERROR(ExpectInt32(kTarget, "n", shape.n));
    BATCHPART_RETURN_IF_ERROR(ExpectInt32(kTarget, "b columns", shape.nrhs));
    return ExpectSolveResults(kTarget, a, b, x, &info, shape.a_batch, shape.b_batch, shape.x_batch,
                              shape.n, shape.nrhs);
  });
}

}  // namespace batchpart
