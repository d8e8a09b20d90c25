// Triangular solves on contiguous rows of row-major matrices, shared by the
// row-major LU solve (lu_steps.h) and the row-major triangular solve
// (triangular_solve.cc): each step updates one row of X from rows already
// solved, so the inner loop is contiguous and vectorizes.
#ifndef BATCHPART_LAPACK_ROW_SUBSTITUTION_H_
#define BATCHPART_LAPACK_ROW_SUBSTITUTION_H_

#include <cstdint>

namespace batchpart::lapack {

// Solves op(A) X = B in place in the row-major p x cols `x` (holding B),
// op(A) = A or A^T (no conjugation) of the row-major p x p `a`, which is
// `lower` or upper triangular. Forward or back substitution by rows; reads
// only that triangle of A, and its diagonal only when it is not unit. A zero
// diagonal gives inf or NaN, as BLAS's trsm does. Always inlined, so that a
// caller compiled per instruction set (target_clones) gets the loop compiled
// for each; the triangular solve calls it uncloned, because on its matrices
// of at most 16x16 AVX-512 loops over a few columns were slower (8x8 with 4
// columns: 129 ns against 68 ns).
template <typename T>
[[gnu::always_inline]] inline void SubstituteOnRows(int64_t p, int64_t cols, const T* a, bool lower,
                                                    bool transpose, bool unit_diagonal, T* x) {
  const auto op = [&](int64_t i, int64_t j) { return transpose ? a[j * p + i] : a[i * p + j]; };
  const bool op_lower = lower != transpose;  // op(A)'s triangle
  for (int64_t step = 0; step < p; ++step) {
    const int64_t i = op_lower ? step : p - 1 - step;
    T* __restrict xi = x + i * cols;
    for (int64_t k = op_lower ? 0 : i + 1, end = op_lower ? i : p; k < end; ++k) {
      const T factor = op(i, k);
      const T* __restrict xk = x + k * cols;
      for (int64_t j = 0; j < cols; ++j) xi[j] -= factor * xk[j];
    }
    if (!unit_diagonal) {
      const T diagonal = op(i, i);
      for (int64_t j = 0; j < cols; ++j) xi[j] /= diagonal;
    }
  }
}

}  // namespace batchpart::lapack

#endif  // BATCHPART_LAPACK_ROW_SUBSTITUTION_H_
