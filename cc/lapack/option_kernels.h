// CPU LAPACK kernels behind batchpart.linalg's options (pivoted and raw QR,
// the QR-iteration SVD, the Cholesky solve) and the CPU's row-major LU,
// solve, triangular solve and QR. Same conventions as the targets in
// common/contracts.h (column-major matrices unless noted, batch loops, NaN
// on failure, int32 integer results); they have no CUDA twin, so they are
// registered for the CPU platform only.
//
// Targets (k = min(m, n)):
//
// batchpart_getrf_row_major  The contract of batchpart_getrf, with a and lu
//                            row-major: XLA needs no relayout on either side
//                            (lu_steps.h).
//
// batchpart_gesv_row_major   The contract of batchpart_gesv, with a, b and x
//                            row-major (lu_steps.h).
//
// batchpart_trsm_row_major   The contract of batchpart_trsm, with a, b and x
//                            row-major: BLAS solves the transposed system on
//                            the same buffers (triangular_solve.cc).
//
// batchpart_qr_row_major     The contract of batchpart_qr, with a, q and r
//                            row-major: a vectorized Householder QR for
//                            small real matrices, LAPACK's LQ factorization
//                            of A^T otherwise (qr_steps.h).
//
// batchpart_geqrf      Householder QR without forming Q (geqrf), numpy's "raw".
//   operand  a       (..., m, n)
//   results  h       (..., m, n)   R on and above the diagonal, reflectors below
//            tau     (..., k)      the reflectors' scalar factors
//
// batchpart_geqp3      Column-pivoted QR (geqp3 + orgqr/ungqr), A[:, p] = Q R.
//   operand  a       (..., m, n)
//   attrs    full_matrices: bool
//   results  q       (..., m, m) if full_matrices else (..., m, k)
//            r       (..., m, n) if full_matrices else (..., k, n); zero below the diagonal
//            p       (..., n) int32   0-based column permutation (0, 1, ... for k = 0)
//
// batchpart_gesvd      SVD by QR iteration (gesvd); the contract of batchpart_svd.
//   operand  a       (..., m, n)
//   attrs    full_matrices: bool, compute_uv: bool
//   results  s       (..., k) real dtype, descending
//            u       (..., m, m) full / (..., m, k) reduced / (..., m, 0) if !compute_uv
//            vt      (..., n, n) full / (..., k, n) reduced / (..., 0, n) if !compute_uv
//            info    (...) int32   nonzero (-4: non-finite input): that element is NaN
//
// batchpart_posv       Hermitian positive-definite solve A X = B (potrf + potrs).
//   operands a       (..., n, n)   only the `lower` (or upper) triangle is read
//            b       (..., n, r)
//   attrs    lower: bool
//   results  x       (..., n, r)   batch dims = the broadcast of a's and b's;
//                                  all NaN where info != 0
//            info    (...) int32   potrf's info; > 0: A not positive definite
#ifndef BATCHPART_LAPACK_OPTION_KERNELS_H_
#define BATCHPART_LAPACK_OPTION_KERNELS_H_

#include <string>
#include <utility>
#include <vector>

#include "xla/ffi/api/api.h"

namespace batchpart::lapack {

inline constexpr char kGetrfRowMajorTarget[] = "batchpart_getrf_row_major";
inline constexpr char kGesvRowMajorTarget[] = "batchpart_gesv_row_major";
inline constexpr char kTrsmRowMajorTarget[] = "batchpart_trsm_row_major";
inline constexpr char kQrRowMajorTarget[] = "batchpart_qr_row_major";

}  // namespace batchpart::lapack

#endif  // BATCHPART_LAPACK_OPTION_KERNELS_H_
