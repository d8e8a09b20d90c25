// The contracts of batchpart's linear-algebra FFI targets, one per operation,
// which the CPU (cc/lapack/, LAPACK) and CUDA (cc/cusolver/, cuSOLVER/cuBLAS)
// kernels implement under the same target names. Each handler dispatches on
// the operand dtype inside (float32, float64, complex64, complex128).
//
// Per target this header holds the name, the shape struct the kernels
// compute with, its validation (contracts.cc: every platform rejects a
// malformed call with the same message) and the FFI signature after the
// platform's context arguments (Bind*). A platform's registration table
// (Handlers() in its kernels.h) lists the targets it implements.
//
// Conventions shared by every target:
// - Matrices are COLUMN-MAJOR: the caller requests, for every operand and
//   result of rank r >= 2, the layout with major-to-minor order
//   (0, ..., r-3, r-1, r-2). Vectors and per-element scalars (pivots, info,
//   eigenvalues) use the default layout.
// - The leading dims are batch dims; the kernel loops over their product,
//   which may be 0. Only trsm and gesv broadcast batch dims between operands
//   (NumPy-style); everywhere else all batch dims are equal.
// - Shapes and dtypes are checked against each other; a mismatch is an
//   INVALID_ARGUMENT error whose message names the target and the shape.
//   Calling a CPU kernel before batchpart._core.lapack.initialize is a
//   FAILED_PRECONDITION error.
// - No input makes a call fail: a batch element whose factorization fails,
//   or that holds NaN/Inf, gets NaN (or garbage) results and a nonzero info.
// - Integer results are int32; "info" is LAPACK's info (0 on success, i > 0
//   for a failure at step i), except that -4 means the kernel refused a
//   non-finite matrix without calling LAPACK (eigh and svd, whose iterative
//   solvers are not safe on NaN/Inf; -4 is LAPACK's code for a bad argument 4,
//   the matrix, in both syevd and gesdd).
// - Bool attributes are i1 attributes (a Python bool passed to ffi_call).
//
// Targets (k = min(m, n)):
//
// batchpart_potrf      Cholesky.
//   operand  a       (..., n, n)
//   attrs    lower: bool       which triangle of a is read and of the factor written
//            symmetrize: bool  factor (a + a^H) / 2 (both triangles read), as
//                              jax's symmetrize_input, instead of the triangle alone
//   results  factor  (..., n, n)  the other triangle zeroed; all NaN where info != 0
//            info    (...) int32
//
// batchpart_getrf      LU with partial pivoting, A[perm] = L U.
//   operand  a       (..., m, n)
//   results  lu      (..., m, n)  unit-lower L below the diagonal, U on and above;
//                                 kept (not NaN) for singular matrices, as jax does
//            pivots  (..., k) int32        0-based: row i was swapped with pivots[i]
//            perm    (..., m) int32        0-based permutation, as jax.lax.linalg.lu
//            info    (...) int32           > 0: U is exactly singular
//
// batchpart_qr         Householder QR.
//   operand  a       (..., m, n)
//   attrs    full_matrices: bool
//   results  q       (..., m, m) if full_matrices else (..., m, k)
//            r       (..., m, n) if full_matrices else (..., k, n); zero below the diagonal
//
// batchpart_eigh       Hermitian eigendecomposition.
//   operand  a       (..., n, n)   only the `lower` (or upper) triangle is read
//   attrs    lower: bool, compute_vectors: bool
//   results  w       (..., n) real dtype (float32 for complex64), ascending
//            v       (..., n, n) if compute_vectors else (..., n, 0); columns are
//                    eigenvectors
//            info    (...) int32   nonzero: w and v of that element are NaN
//
// batchpart_svd        SVD, A = U diag(s) Vt.
//   operand  a       (..., m, n)
//   attrs    full_matrices: bool, compute_uv: bool
//   results  s       (..., k) real dtype, descending
//            u       (..., m, m) full / (..., m, k) reduced / (..., m, 0) if !compute_uv
//            vt      (..., n, n) full / (..., k, n) reduced / (..., 0, n) if !compute_uv
//            info    (...) int32   nonzero: s, u, vt of that element are NaN
//   For k = 0, u and vt are identity matrices (as numpy returns).
//
// batchpart_trsm       Triangular solve, no in-place requirement.
//   operands a       (..., p, p)   triangular; the other triangle is not read
//            b       (..., p, q) if left_side else (..., q, p)
//   attrs    left_side: bool       solve op(A) X = B (true) or X op(A) = B (false)
//            lower: bool
//            transpose_a: bool     op(A) = A^T ...
//            conjugate_a: bool     ... conj(A) / A^H with transpose_a (as
//                                  jax.lax.linalg.triangular_solve; ignored for
//                                  real dtypes)
//            unit_diagonal: bool
//   results  x       b's core shape; batch dims = the broadcast of a's and b's
//
// batchpart_gesv       General solve A X = B (LU, then triangular solves).
//   operands a       (..., n, n)
//            b       (..., n, r)
//   results  x       (..., n, r)   batch dims = the broadcast of a's and b's;
//                                  all NaN where info != 0
//            info    (...) int32   getrf's info over the broadcast batch; > 0:
//                                  A exactly singular
#ifndef BATCHPART_COMMON_CONTRACTS_H_
#define BATCHPART_COMMON_CONTRACTS_H_

#include <cstdint>
#include <utility>

#include "common/ffi_helpers.h"

namespace batchpart {

// ---- target names ------------------------------------------------------------

inline constexpr char kPotrfTarget[] = "batchpart_potrf";
inline constexpr char kGetrfTarget[] = "batchpart_getrf";
inline constexpr char kQrTarget[] = "batchpart_qr";
inline constexpr char kEighTarget[] = "batchpart_eigh";
inline constexpr char kSvdTarget[] = "batchpart_svd";
inline constexpr char kTrsmTarget[] = "batchpart_trsm";
inline constexpr char kGesvTarget[] = "batchpart_gesv";

// The info of a matrix a kernel refused because it holds NaN/Inf.
inline constexpr int32_t kNonFiniteInfo = -4;

// ---- shapes and their validation (contracts.cc) -------------------------------
//
// Each Validate* checks the operand dtype, every operand's and result's shape
// and dtype against the contract above, and that the matrix dims fit 32-bit
// integers; it returns the shape the kernel computes with. The shapes' Dims
// point into the buffers' dimensions, which outlive the call.

struct CholeskyShape {
  Dims batch;
  int64_t n;
};
ffi::ErrorOr<CholeskyShape> ValidatePotrf(const ffi::AnyBuffer& a, const ffi::AnyBuffer& factor,
                                          const ffi::AnyBuffer& info);

struct LuShape {
  Dims batch;
  int64_t m, n, k;
};
// `target` names the caller in errors (the CPU's row-major LU shares the contract).
ffi::ErrorOr<LuShape> ValidateGetrf(const ffi::AnyBuffer& a, const ffi::AnyBuffer& lu,
                                    const ffi::AnyBuffer& pivots, const ffi::AnyBuffer& perm,
                                    const ffi::AnyBuffer& info, const char* target = kGetrfTarget);

struct QrShape {
  Dims batch;
  int64_t m, n, k;
  int64_t q_cols;  // m (full) or k (reduced)
  int64_t r_rows;  // m (full) or k (reduced)
};
// `target` names the caller in errors (the CPU's row-major and pivoted QR
// share the contract's q and r).
ffi::ErrorOr<QrShape> ValidateQr(const ffi::AnyBuffer& a, const ffi::AnyBuffer& q,
                                 const ffi::AnyBuffer& r, bool full_matrices,
                                 const char* target = kQrTarget);

struct EighShape {
  Dims batch;
  int64_t n;
  int64_t v_cols;  // n, or 0 when eigenvectors are not computed
};
ffi::ErrorOr<EighShape> ValidateEigh(const ffi::AnyBuffer& a, const ffi::AnyBuffer& w,
                                     const ffi::AnyBuffer& v, const ffi::AnyBuffer& info,
                                     bool compute_vectors);

struct SvdShape {
  Dims batch;
  int64_t m, n, k;
  int64_t u_cols;   // m (full), k (reduced) or 0 (no U/Vt)
  int64_t vt_rows;  // n (full), k (reduced) or 0 (no U/Vt)
  bool compute_uv, full_matrices;
};
// `target` names the caller in errors (the CPU's QR-iteration SVD shares the contract).
ffi::ErrorOr<SvdShape> ValidateSvd(const ffi::AnyBuffer& a, const ffi::AnyBuffer& s,
                                   const ffi::AnyBuffer& u, const ffi::AnyBuffer& vt,
                                   const ffi::AnyBuffer& info, bool full_matrices, bool compute_uv,
                                   const char* target = kSvdTarget);

struct TrsmOptions {
  bool left_side, lower, transpose_a, conjugate_a, unit_diagonal;
};
struct TrsmShape {
  Dims a_batch, b_batch, x_batch;
  int64_t p;           // A is p x p
  int64_t rows, cols;  // of B and X
};
// `target` names the caller in errors (the CPU's row-major trsm shares the contract).
ffi::ErrorOr<TrsmShape> ValidateTrsm(const ffi::AnyBuffer& a, const ffi::AnyBuffer& b,
                                     const ffi::AnyBuffer& x, bool left_side,
                                     const char* target = kTrsmTarget);

struct GesvShape {
  Dims a_batch, b_batch, x_batch;
  int64_t n, nrhs;
};
// `target` names the caller in errors (the CPU's row-major solve and its
// Cholesky solve share the contract's shapes).
ffi::ErrorOr<GesvShape> ValidateGesv(const ffi::AnyBuffer& a, const ffi::AnyBuffer& b,
                                     const ffi::AnyBuffer& x, const ffi::AnyBuffer& info,
                                     const char* target = kGesvTarget);

// The batch dims and last two dims of a matrix.
struct MatrixDims {
  Dims batch;
  int64_t rows, cols;
};

// Operand a of a factorization: a linalg dtype, a matrix (square when
// `square`) whose dims fit 32-bit integers.
ffi::Error ExpectOperandA(const char* target, const ffi::AnyBuffer& a, bool square,
                          MatrixDims& dims);

// ---- FFI signatures ------------------------------------------------------------
//
// Bind*(ffi::Ffi::Bind().Ctx<...>()) appends a target's operands, results and
// attributes, in the order its handler takes them, to a binding that holds
// the platform's context arguments.

template <typename Binding>
auto BindPotrf(Binding binding) {
  return std::move(binding)
      .template Arg<ffi::AnyBuffer>()  // a
      .template Ret<ffi::AnyBuffer>()  // factor
      .template Ret<ffi::AnyBuffer>()  // info
      .template Attr<bool>("lower")
      .template Attr<bool>("symmetrize");
}

template <typename Binding>
auto BindGetrf(Binding binding) {
  return std::move(binding)
      .template Arg<ffi::AnyBuffer>()   // a
      .template Ret<ffi::AnyBuffer>()   // lu
      .template Ret<ffi::AnyBuffer>()   // pivots
      .template Ret<ffi::AnyBuffer>()   // permutation
      .template Ret<ffi::AnyBuffer>();  // info
}

template <typename Binding>
auto BindQr(Binding binding) {
  return std::move(binding)
      .template Arg<ffi::AnyBuffer>()  // a
      .template Ret<ffi::AnyBuffer>()  // q
      .template Ret<ffi::AnyBuffer>()  // r
      .template Attr<bool>("full_matrices");
}

template <typename Binding>
auto BindEigh(Binding binding) {
  return std::move(binding)
      .template Arg<ffi::AnyBuffer>()  // a
      .template Ret<ffi::AnyBuffer>()  // eigenvalues
      .template Ret<ffi::AnyBuffer>()  // eigenvectors
      .template Ret<ffi::AnyBuffer>()  // info
      .template Attr<bool>("lower")
      .template Attr<bool>("compute_vectors");
}

template <typename Binding>
auto BindSvd(Binding binding) {
  return std::move(binding)
      .template Arg<ffi::AnyBuffer>()  // a
      .template Ret<ffi::AnyBuffer>()  // s
      .template Ret<ffi::AnyBuffer>()  // u
      .template Ret<ffi::AnyBuffer>()  // vt
      .template Ret<ffi::AnyBuffer>()  // info
      .template Attr<bool>("full_matrices")
      .template Attr<bool>("compute_uv");
}

template <typename Binding>
auto BindTrsm(Binding binding) {
  return std::move(binding)
      .template Arg<ffi::AnyBuffer>()  // a
      .template Arg<ffi::AnyBuffer>()  // b
      .template Ret<ffi::AnyBuffer>()  // x
      .template Attr<bool>("left_side")
      .template Attr<bool>("lower")
      .template Attr<bool>("transpose_a")
      .template Attr<bool>("conjugate_a")
      .template Attr<bool>("unit_diagonal");
}

template <typename Binding>
auto BindGesv(Binding binding) {
  return std::move(binding)
      .template Arg<ffi::AnyBuffer>()   // a
      .template Arg<ffi::AnyBuffer>()   // b
      .template Ret<ffi::AnyBuffer>()   // x
      .template Ret<ffi::AnyBuffer>();  // info
}

}  // namespace batchpart

#endif  // BATCHPART_COMMON_CONTRACTS_H_
