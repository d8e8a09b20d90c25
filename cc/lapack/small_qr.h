// Householder QR of many small real matrices at once, on the
// batch-interleaved layout (interleaved.h): the qr kernels' path for batches
// of matrices small enough that one call each (LAPACK's geqrf and orgqr, or
// the row-major RowMajorHouseholderQr) costs more in overhead than in
// arithmetic.
//
// The algorithm is RowMajorHouseholderQr's (qr_steps.h), lane by lane:
// geqr2's reflectors with LAPACK's signs (R's diagonal is -sign(alpha) *
// norm; a column already zero below the diagonal gets tau = 0, H = I), the
// norms summed in double and rescaled out of double's safe range as
// ColumnNorm does, v formed by division, then org2r's backward accumulation
// of Q. Complex matrices keep the per-matrix path.
#ifndef BATCHPART_LAPACK_SMALL_QR_H_
#define BATCHPART_LAPACK_SMALL_QR_H_

#include <algorithm>
#include <cstdint>

#include "lapack/interleaved.h"

namespace batchpart::lapack::interleaved {

// The sizes (max(m, n)) each target runs interleaved; elsewhere the
// per-matrix path is faster. Measured through jax (bp.linalg.qr, the
// row-major target, reduced Q and R) on one CPU device, single-threaded,
// random square matrices; AMD EPYC with AVX-512, shared, so +-20%;
// microseconds per matrix, per-matrix path -> interleaved:
//          n=2        4          8          16         24         32         48        64
//   f64  0.12->0.04 0.30->0.07 0.72->0.23 3.4->0.94 6.7->3.1  9.3->9.1  25->19   52->116
//   f32  0.10->0.03 0.33->0.06 0.88->0.16 3.1->0.76 4.6->1.6  7.7->5.3  18->12   37->54
// At 64 a group of A and Q (8 or 16 matrices) no longer fits in L2. The
// column-major target's per-matrix path, LAPACK's geqrf + orgqr, is slower
// (same measurement on the raw target, reduced):
//          n=4        16         32         48        56        64
//   f64  0.95->0.34 5.4->1.4  18.6->11.0 47->30    83->53    105->142
//   f32  0.63->0.08 5.9->1.0  25->9.7    42->19    76->26    122->81
template <typename T>
inline constexpr SizeRange kQrColumnMajorSizes = {1, kSingle<T> ? 64 : 56};
template <typename T>
inline constexpr SizeRange kQrRowMajorSizes = {1, 48};

// Writes the QR of the kLanes<T> m x n matrices of `a` (destroyed: it holds
// the reflectors afterwards) to `q` (m x q_cols, q_cols <= m, the first
// q_cols columns of Q) and `r` (r_rows x n, r_rows <= m, zero below the
// diagonal). Instantiated for float and double.
template <typename T>
void QrGroup(Group<T>& a, Group<T>& q, Group<T>& r);

// Whether a batch of real m x n matrices takes the interleaved QR, as
// GetSmallPath(SmallKernel::kQr) has it (sizes: a k*Sizes range above).
inline bool UseSmallQr(SizeRange sizes, int64_t m, int64_t n, int64_t batch) {
  return m >= 1 && n >= 1 && batch >= 1 &&
         UseSmallPath(SmallKernel::kQr, batch >= 2 && sizes.contains(std::max(m, n)));
}

}  // namespace batchpart::lapack::interleaved

#endif  // BATCHPART_LAPACK_SMALL_QR_H_
