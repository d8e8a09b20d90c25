// batchpart's CPU linear-algebra kernels: typed XLA FFI handlers over LAPACK.
//
// One target per operation; each dispatches on the operand dtype inside
// (float32, float64, complex64, complex128), so that a CUDA twin can later
// register under the same name.
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
//   Calling a kernel before batchpart._core.lapack.initialize is a
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
// batchpart_qr         Householder QR (geqrf + orgqr/ungqr).
//   operand  a       (..., m, n)
//   attrs    full_matrices: bool
//   results  q       (..., m, m) if full_matrices else (..., m, k)
//            r       (..., m, n) if full_matrices else (..., k, n); zero below the diagonal
//
// batchpart_eigh       Hermitian eigendecomposition (syevd/heevd).
//   operand  a       (..., n, n)   only the `lower` (or upper) triangle is read
//   attrs    lower: bool, compute_vectors: bool
//   results  w       (..., n) real dtype (float32 for complex64), ascending
//            v       (..., n, n) if compute_vectors else (..., n, 0); columns are
//                    eigenvectors
//            info    (...) int32   nonzero: w and v of that element are NaN
//
// batchpart_svd        SVD by divide and conquer (gesdd), A = U diag(s) Vt.
//   operand  a       (..., m, n)
//   attrs    full_matrices: bool, compute_uv: bool
//   results  s       (..., k) real dtype, descending
//            u       (..., m, m) full / (..., m, k) reduced / (..., m, 0) if !compute_uv
//            vt      (..., n, n) full / (..., k, n) reduced / (..., 0, n) if !compute_uv
//            info    (...) int32   nonzero: s, u, vt of that element are NaN
//   For k = 0, u and vt are identity matrices (as numpy returns).
//
// batchpart_trsm       Triangular solve (BLAS trsm), no in-place requirement.
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
// batchpart_gesv       General solve A X = B (getrf + getrs).
//   operands a       (..., n, n)
//            b       (..., n, r)
//   results  x       (..., n, r)   batch dims = the broadcast of a's and b's;
//                                  all NaN where info != 0
//            info    (...) int32   getrf's info over the broadcast batch; > 0:
//                                  A exactly singular
#ifndef BATCHPART_LAPACK_KERNELS_H_
#define BATCHPART_LAPACK_KERNELS_H_

#include <string>
#include <utility>
#include <vector>

#include "xla/ffi/api/api.h"

namespace batchpart::lapack {

XLA_FFI_DECLARE_HANDLER_SYMBOL(BatchpartPotrf);
XLA_FFI_DECLARE_HANDLER_SYMBOL(BatchpartGetrf);
XLA_FFI_DECLARE_HANDLER_SYMBOL(BatchpartQr);
XLA_FFI_DECLARE_HANDLER_SYMBOL(BatchpartEigh);
XLA_FFI_DECLARE_HANDLER_SYMBOL(BatchpartSvd);
XLA_FFI_DECLARE_HANDLER_SYMBOL(BatchpartTrsm);
XLA_FFI_DECLARE_HANDLER_SYMBOL(BatchpartGesv);

// (target name, XLA_FFI_Handler*) for every kernel above.
inline std::vector<std::pair<std::string, void*>> Handlers() {
  return {
      {"batchpart_potrf", reinterpret_cast<void*>(BatchpartPotrf)},
      {"batchpart_getrf", reinterpret_cast<void*>(BatchpartGetrf)},
      {"batchpart_qr", reinterpret_cast<void*>(BatchpartQr)},
      {"batchpart_eigh", reinterpret_cast<void*>(BatchpartEigh)},
      {"batchpart_svd", reinterpret_cast<void*>(BatchpartSvd)},
      {"batchpart_trsm", reinterpret_cast<void*>(BatchpartTrsm)},
      {"batchpart_gesv", reinterpret_cast<void*>(BatchpartGesv)},
  };
}

}  // namespace batchpart::lapack

#endif  // BATCHPART_LAPACK_KERNELS_H_
