// Householder QR of many small matrices at once, on the
// batch-interleaved layout (interleaved.h): the qr kernels' path for batches
// of matrices small enough that one call each (LAPACK's geqrf and orgqr, or
// the row-major RowMajorHouseholderQr) costs more in overhead than in
// arithmetic.
//
// The algorithm is RowMajorHouseholderQr's (qr_steps.h), lane by lane:
// geqr2's reflectors with LAPACK's signs (R's diagonal is -sign(re(alpha)) *
// norm, real; a column already zero below the diagonal, with a real alpha,
// gets tau = 0, H = I), the norms summed in double and rescaled out of
// double's safe range as ColumnNorm does, v formed by division, then org2r's
// backward accumulation of Q. A complex matrix is two planes (interleaved.h):
// geqr2 applies each H^H = I - conj(tau) v v^H, ung2r each H.
#ifndef BATCHPART_LAPACK_SMALL_QR_H_
#define BATCHPART_LAPACK_SMALL_QR_H_

#include <algorithm>
#include <cstdint>
#include <vector>

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
//
// Complex matrices, the same measurements (row-major through bp.linalg.qr):
//          n=2        8          16         32         48        56        64
//   c128 0.26->0.03 1.8->0.25  6.9->1.5   30->11    63->28    88->55    136->96..147->181
//   c64  0.27->0.04 1.8->0.21  6.3->0.85  29->6.4   58->20    81->31    118->124..251->99
// and on the column-major target c128 56: 106->75, 64: 147->181; c64 64:
// 249->101. On the thread pool (benchmarks/small_matrices.py --switch
// --dtypes complex64,complex128 --ops qr), the row-major per-matrix path
// over the interleaved one: c128 1.6x at 48 and 56, 0.6x at 64; c64 2.6x at
// 56, 0.95-1.24x at 64. So the same column-major sizes as the real types,
// and row-major up to 56.
//
// A lone matrix runs QrOne, whose sums follow the group's order, one chain
// per column, where the row-major per-matrix path (RowMajorHouseholderQr)
// sums each column in two halves with fused multiply-adds. Through
// bp.linalg.qr, a batch of one, per-matrix path -> QrOne, us:
//          n=16       24         32         40         48
//   f32  11.5->11.2 13.2->15.6 15.8->21.1 19.0->26.3 23.5->36.8
//   f64  11.7->12.2 13.5->15.8 17.3->21.2      -     34.9->43.6
// (complex: QrOne 0.71-0.87x LAPACK's LQ time at 32 and 48). So the real
// types run row-major interleaved up to 24, where a lone matrix stays
// within 1.2x; LAPACK's column-major geqrf + orgqr, 2-3x slower per matrix,
// keeps its sizes.
template <typename T>
inline constexpr SizeRange kQrColumnMajorSizes = {1, kSingle<T> ? 64 : 56};
template <typename T>
inline constexpr SizeRange kQrRowMajorSizes = {1, kIsComplex<T> ? 56 : 24};

// Writes the QR of the kLanes<T> m x n matrices of `a` (destroyed: it holds
// the reflectors afterwards) to `q` (m x q_cols, q_cols <= m, the first
// q_cols columns of Q) and `r` (r_rows x n, r_rows <= m, zero below the
// diagonal). Instantiated for the four LAPACK types.
template <typename T>
void QrGroup(Group<T>& a, Group<T>& q, Group<T>& r);

// The one-matrix twin of QrGroup, for a group too small to repay its
// padding: the same bits, on one row-major matrix (a's element (i, j) is
// the group's). `scratch` is resized to what it needs.
template <typename T>
void QrOne(Group<T, 1>& a, Group<T, 1>& q, Group<T, 1>& r, std::vector<Real<T>>& scratch);

// A group of fewer matrices factors them one by one (QrOne).
inline constexpr int64_t kSmallQrMinGroup = 2;

// Whether m x n matrices take the interleaved QR, as
// GetSmallPath(SmallKernel::kQr) has it (sizes: a k*Sizes range above): by
// size alone, so that a matrix gets the same bits in any batch.
inline bool UseSmallQr(SizeRange sizes, int64_t m, int64_t n) {
  return m >= 1 && n >= 1 && UseSmallPath(SmallKernel::kQr, sizes.contains(std::max(m, n)));
}

}  // namespace batchpart::lapack::interleaved

#endif  // BATCHPART_LAPACK_SMALL_QR_H_
