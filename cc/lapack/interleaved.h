// The batch-interleaved layout of the small-matrix kernels (small_*.cc).
//
// For n up to a few dozen, one LAPACK call per matrix costs more in fixed
// overhead (argument checks, blocking decisions, a BLAS call per column) than
// in arithmetic. The small-matrix kernels instead run the unblocked algorithm
// on kLanes<T> matrices at once: a Group holds them side by side, element
// (i, j) of matrix l at [(i * cols + j) * kLanes + l], so every scalar step of
// the algorithm becomes one loop over the lanes, which the compiler turns into
// one SIMD instruction (kLanes is one 512-bit register of the real type: 8
// doubles, 16 floats; AVX2 takes two). A complex matrix is two such planes,
// real and imaginary, so complex arithmetic is real SIMD arithmetic too.
//
// Packing reads each matrix once and unpacking writes it once, so a kernel on
// a group touches its matrices' memory twice, as a memory pass would; the
// group (<= 64 KiB at n = 32) stays in cache in between.
#ifndef BATCHPART_LAPACK_INTERLEAVED_H_
#define BATCHPART_LAPACK_INTERLEAVED_H_

#include <complex>
#include <cstdint>
#include <vector>

#include "lapack/lapack_api.h"

namespace batchpart::lapack::interleaved {

// Matrices per group: one 512-bit vector of the real type.
template <typename T>
inline constexpr int kLanes = static_cast<int>(64 / sizeof(Real<T>));

// Where a matrix's element (i, j) lies: data + i * row_stride + j * col_stride
// (column-major n x n: row_stride 1, col_stride n; row-major: the reverse).
struct Strides {
  int64_t row_stride;
  int64_t col_stride;
};

inline Strides ColumnMajor(int64_t rows) { return {1, rows}; }
inline Strides RowMajor(int64_t cols) { return {cols, 1}; }

// kLanes<T> matrices of rows x cols in the interleaved layout: re (and im
// for complex T) of rows * cols * kLanes<T> reals each.
template <typename T>
class Group {
 public:
  using R = Real<T>;
  static constexpr int W = kLanes<T>;

  Group(int64_t rows, int64_t cols)
      : rows_(rows), cols_(cols), re_(rows * cols * W), im_(kIsComplex<T> ? rows * cols * W : 0) {}

  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  // The W lanes of element (i, j).
  R* re(int64_t i, int64_t j) { return re_.data() + (i * cols_ + j) * W; }
  R* im(int64_t i, int64_t j) { return im_.data() + (i * cols_ + j) * W; }
  const R* re(int64_t i, int64_t j) const { return re_.data() + (i * cols_ + j) * W; }
  const R* im(int64_t i, int64_t j) const { return im_.data() + (i * cols_ + j) * W; }

  // Reads matrices src[0..count) (count <= W) into lanes [0, count); lanes
  // may read the same matrix (a broadcast operand). Lanes past count get the
  // identity (zero where not square), which every kernel factors and solves
  // without a failure, so padding lanes never produce NaN or Inf work.
  void Pack(const T* const* src, int64_t count, Strides s) {
    // Matrix by matrix: the loop reads one matrix, not count of them at once,
    // and needs no test of the lane count per element.
    for (int64_t l = 0; l < count; ++l) {
      const T* matrix = src[l];
      for (int64_t i = 0; i < rows_; ++i) {
        R* r = re(i, 0) + l;
        [[maybe_unused]] R* m = kIsComplex<T> ? im(i, 0) + l : nullptr;
        for (int64_t j = 0; j < cols_; ++j) {
          const T v = matrix[i * s.row_stride + j * s.col_stride];
          if constexpr (kIsComplex<T>) {
            r[j * W] = v.real();
            m[j * W] = v.imag();
          } else {
            r[j * W] = v;
          }
        }
      }
    }
    for (int64_t l = count; l < W; ++l) {
      for (int64_t i = 0; i < rows_; ++i) {
        for (int64_t j = 0; j < cols_; ++j) {
          re(i, j)[l] = i == j ? R(1) : R(0);
          if constexpr (kIsComplex<T>) im(i, j)[l] = R(0);
        }
      }
    }
  }

  // Writes lanes [0, count) back, lane l to the matrix at dst[l].
  void Unpack(T* const* dst, int64_t count, Strides s) const {
    for (int64_t l = 0; l < count; ++l) {
      T* matrix = dst[l];
      for (int64_t i = 0; i < rows_; ++i) {
        const R* r = re(i, 0) + l;
        [[maybe_unused]] const R* m = kIsComplex<T> ? im(i, 0) + l : nullptr;
        for (int64_t j = 0; j < cols_; ++j) {
          T& out = matrix[i * s.row_stride + j * s.col_stride];
          if constexpr (kIsComplex<T>) {
            out = T(r[j * W], m[j * W]);
          } else {
            out = r[j * W];
          }
        }
      }
    }
  }

 private:
  int64_t rows_, cols_;
  std::vector<R> re_, im_;
};

}  // namespace batchpart::lapack::interleaved

#endif  // BATCHPART_LAPACK_INTERLEAVED_H_
