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

// Sized by max(m, n) (SizeRange). At 64 a group of A and Q no longer fits
// in L2.
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
