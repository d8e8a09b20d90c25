// LU steps shared by the getrf and gesv kernels: LAPACK's getrf on one
// column-major matrix, and LU factorization and solve of row-major ones.
//
// The row-major LU is the unblocked, right-looking algorithm of LAPACK's
// getf2, with the same pivot choice (largest |re| + |im|, the first of
// equals) and the same singular case (an exactly zero column leaves its
// pivot in place and sets info). Row-major suits it: the row swap and each
// row's update are contiguous, so the update vectorizes, and the batch needs
// no transposes to and from LAPACK's column-major order. Up to 64x64 it is
// faster than OpenBLAS's recursive getrf (single-threaded, float32,
// AVX-512: 1.2x at 64, 1.7x at 16); above that the blocked getrf wins and
// FactorRowMajor hands it a transposed copy.
#ifndef BATCHPART_LAPACK_LU_STEPS_H_
#define BATCHPART_LAPACK_LU_STEPS_H_

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "lapack/kernel_helpers.h"
#include "lapack/lapack_api.h"
#include "lapack/row_substitution.h"

namespace batchpart::lapack {

// The largest min(m, n) factored by RowMajorLu instead of LAPACK.
inline constexpr int64_t kRowMajorLuMaxSize = 64;

// LAPACK's pivot magnitude (i?amax): |x| for real x, |re| + |im| for complex.
template <typename T>
auto PivotMagnitude(const T& x) {
  return std::abs(x);
}
template <typename R>
R PivotMagnitude(const std::complex<R>& x) {
  return std::abs(x.real()) + std::abs(x.imag());
}

// Factors the m x n row-major `a` (leading dimension n) into unit-lower L
// below the diagonal and U on and above it; `pivots[i]` (0-based) is the row
// swapped with row i, for i < min(m, n). Returns getrf's info: 0, or 1 + the
// first exactly zero pivot. Compiled once per instruction set where the
// compiler can pick at load time (the wheel targets a baseline x86-64 CPU;
// the row updates are most of the work and vectorize).
template <typename T>
#if defined(__GNUC__) && defined(__x86_64__) && defined(__linux__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
int32_t RowMajorLu(int64_t m, int64_t n, T* a, int32_t* pivots) {
  int32_t info = 0;
  const int64_t k_end = m < n ? m : n;
  for (int64_t k = 0; k < k_end; ++k) {
    int64_t p = k;
    auto best = PivotMagnitude(a[k * n + k]);
    for (int64_t i = k + 1; i < m; ++i) {
      const auto v = PivotMagnitude(a[i * n + k]);
      if (v > best) best = v, p = i;
    }
    pivots[k] = static_cast<int32_t>(p);
    if (a[p * n + k] == T(0)) {
      // The column below is zero too: nothing to swap, scale or update.
      if (info == 0) info = static_cast<int32_t>(k + 1);
      continue;
    }
    T* pivot_row = a + k * n;
    if (p != k) {
      T* other = a + p * n;
      for (int64_t j = 0; j < n; ++j) std::swap(pivot_row[j], other[j]);
    }
    // As getf2: multiply by the reciprocal unless it would overflow.
    const bool tiny = std::abs(pivot_row[k]) < std::numeric_limits<Real<T>>::min();
    const T inverse = T(1) / pivot_row[k];
    for (int64_t i = k + 1; i < m; ++i) {
      T* __restrict row = a + i * n;
      const T* __restrict u = pivot_row;
      const T l = tiny ? row[k] / pivot_row[k] : row[k] * inverse;
      row[k] = l;
      for (int64_t j = k + 1; j < n; ++j) row[j] -= l * u[j];
    }
  }
  return info;
}

// getrf on the column-major m x n `lu`, in place; pivots made 0-based.
// Returns getrf's info.
template <typename T>
int32_t LapackLu(int64_t m_size, int64_t n_size, T* lu, int32_t* pivots) {
  static_assert(sizeof(lapack_int) == sizeof(int32_t), "getrf writes pivots in place");
  lapack_int m = static_cast<lapack_int>(m_size), n = static_cast<lapack_int>(n_size);
  lapack_int lda = LeadingDim(m_size), info = 0;
  Lapack<T>::getrf(&m, &n, lu, &lda, pivots, &info);
  for (int64_t i = 0; i < std::min(m_size, n_size); ++i) --pivots[i];
  return info;
}

// Writes the transpose of the row-major rows x cols `src` to `dst` (so
// `dst` holds `src` column-major), in tiles that stay in cache on both sides.
template <typename T>
void Transpose(const T* src, int64_t rows, int64_t cols, T* dst) {
  constexpr int64_t kTile = 32;
  for (int64_t i0 = 0; i0 < rows; i0 += kTile) {
    for (int64_t j0 = 0; j0 < cols; j0 += kTile) {
      const int64_t i1 = std::min(rows, i0 + kTile), j1 = std::min(cols, j0 + kTile);
      for (int64_t j = j0; j < j1; ++j) {
        for (int64_t i = i0; i < i1; ++i) dst[j * rows + i] = src[i * cols + j];
      }
    }
  }
}

// The LU of the row-major m x n `a`, in place, as RowMajorLu returns it:
// small matrices directly, larger ones by LAPACK's blocked getrf on a
// column-major copy in `scratch`.
template <typename T>
int32_t FactorRowMajor(int64_t m, int64_t n, T* a, int32_t* pivots, AlignedVector<T>& scratch) {
  if (std::min(m, n) <= kRowMajorLuMaxSize) return RowMajorLu(m, n, a, pivots);
  scratch.resize(m * n);
  Transpose(a, m, n, scratch.data());
  const int32_t info = LapackLu(m, n, scratch.data(), pivots);
  Transpose(scratch.data(), n, m, a);
  return info;
}

// Forward and back substitution L Y = X, U X = Y on the row-major n x r
// `x`, given the row-major `lu` (L unit lower, U upper). Compiled once per
// instruction set where the compiler can pick at load time.
template <typename T>
#if defined(__GNUC__) && defined(__x86_64__) && defined(__linux__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
void SubstituteRows(int64_t n, int64_t r, const T* lu, T* x) {
  SubstituteOnRows(n, r, lu, /*lower=*/true, /*transpose=*/false, /*unit_diagonal=*/true, x);
  SubstituteOnRows(n, r, lu, /*lower=*/false, /*transpose=*/false, /*unit_diagonal=*/false, x);
}

// The same substitution by BLAS on the transposed system: read column-major,
// the row-major X is X^T and the row-major LU holds L^T (unit upper) and U^T
// (lower), and L U X = Y is X^T U^T L^T = Y^T. Blocked trsm beats the row
// updates once A is larger than RowMajorLu's range.
template <typename T>
void SubstituteWithBlas(int64_t n, int64_t r, const T* lu, T* x) {
  lapack_int rows = static_cast<lapack_int>(r), cols = static_cast<lapack_int>(n);
  lapack_int lda = LeadingDim(n), ldb = LeadingDim(r);
  char right = 'R', upper = 'U', lower = 'L', no_trans = 'N', unit = 'U', non_unit = 'N';
  T one(1);
  T* a = const_cast<T*>(lu);
  Lapack<T>::trsm(&right, &upper, &no_trans, &unit, &rows, &cols, &one, a, &lda, x, &ldb);
  Lapack<T>::trsm(&right, &lower, &no_trans, &non_unit, &rows, &cols, &one, a, &lda, x, &ldb);
}

// Overwrites the row-major n x r `x` (holding B) with the solution of
// A X = B, given the row-major LU of A and its 0-based pivots from
// FactorRowMajor (U nonsingular): the row swaps, then the substitution.
template <typename T>
void SolveRowMajorLu(int64_t n, int64_t r, const T* lu, const int32_t* pivots, T* x) {
  for (int64_t i = 0; i < n; ++i) {
    if (pivots[i] != i) std::swap_ranges(x + i * r, x + (i + 1) * r, x + pivots[i] * r);
  }
  if (n == 0 || r == 0) return;
  if (n <= kRowMajorLuMaxSize) {
    SubstituteRows(n, r, lu, x);
  } else {
    SubstituteWithBlas(n, r, lu, x);
  }
}

}  // namespace batchpart::lapack

#endif  // BATCHPART_LAPACK_LU_STEPS_H_
