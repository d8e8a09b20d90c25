// LU with partial pivoting of one row-major matrix, in place: the unblocked,
// right-looking algorithm of LAPACK's getf2, with the same pivot choice
// (largest |re| + |im|, the first of equals) and the same singular case
// (an exactly zero column leaves its pivot in place and sets info).
//
// Row-major suits it: the row swap and each row's update are contiguous, so
// the update vectorizes, and the batch needs no transposes to and from
// LAPACK's column-major order. Up to about 64x64 it is faster than
// OpenBLAS's recursive getrf (single-threaded, float32, AVX-512: 1.2x at 64,
// 1.7x at 16); above that the blocked getrf wins and the kernel transposes.
#ifndef BATCHPART_LAPACK_ROW_MAJOR_LU_H_
#define BATCHPART_LAPACK_ROW_MAJOR_LU_H_

#include <cmath>
#include <complex>
#include <cstdint>
#include <limits>
#include <utility>

#include "lapack/kernel_helpers.h"

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

}  // namespace batchpart::lapack

#endif  // BATCHPART_LAPACK_ROW_MAJOR_LU_H_
