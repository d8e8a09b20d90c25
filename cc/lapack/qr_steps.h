// QR steps of the CPU's row-major QR kernel: a vectorized Householder QR of
// small real matrices, and LAPACK's LQ factorization for the rest.
//
// Small real matrices: the unblocked algorithm of LAPACK's geqr2 and org2r
// (same reflectors, same signs: R's diagonal is -sign(alpha) * norm), on a
// copy whose rows are padded to whole vectors. Row-major suits Householder
// reflections: applying I - tau v v^T to a block is a weighted sum of its
// rows, then a rank-1 update of each row, and both run over contiguous
// columns. Padding lets every update run in whole vectors (a pad column
// stays zero and never mixes into a real one: each column is updated from
// itself alone). Single-threaded, float32, AVX-512, Q and R of one matrix
// against OpenBLAS's geqrf + orgqr with the transposes XLA would add:
// 2.1x faster at 8x8, 3.2x at 32x32, 2.9x at 64x64, 2.1x at 128x128; at
// 256x256 the blocked LAPACK routines win.
//
// Complex and larger matrices: the row-major m x n A, read column-major, is
// A^T. Its LQ factorization A^T = L Q' (gelqf, then orglq/unglq) gives
// A = Q'^T L^T, so Q = Q'^T and R = L^T; read row-major, those are exactly
// the column-major Q' and L that LAPACK writes. No transpose on either side.
#ifndef BATCHPART_LAPACK_QR_STEPS_H_
#define BATCHPART_LAPACK_QR_STEPS_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "common/contracts.h"
#include "lapack/kernel_helpers.h"
#include "lapack/lapack_api.h"

namespace batchpart::lapack {

// RowMajorHouseholderQr's range: real matrices with min(m, n) at most 128
// and m * max(n, columns of Q) at most 128 x 128 (the padded copies of A and
// of Q then stay in L2).
inline constexpr int64_t kRowMajorQrMaxSize = 128;

template <typename T>
bool UsesRowMajorHouseholder(const QrShape& shape) {
  return !kIsComplex<T> && shape.k <= kRowMajorQrMaxSize &&
         shape.m * std::max(shape.n, shape.q_cols) <= kRowMajorQrMaxSize * kRowMajorQrMaxSize;
}

// Elements of T in one 64-byte vector, the widest the kernel is cloned for.
template <typename T>
inline constexpr int64_t kLanes = 64 / static_cast<int64_t>(sizeof(T));

// A padded row length for `cols` columns: a run of whole vectors starting
// at any column below `cols` ends inside the row.
template <typename T>
int64_t PaddedRowLength(int64_t cols) {
  return (cols + 2 * kLanes<T> - 1) / kLanes<T> * kLanes<T>;
}

// Whether a sum of squares in double is one whose square root is the norm
// to double's accuracy: neither underflowed nor overflowed (NaN passes on).
inline bool SumOfSquaresIsSafe(double sum) {
  constexpr double kLow =
      std::numeric_limits<double>::min() / std::numeric_limits<double>::epsilon();
  constexpr double kHigh = std::numeric_limits<double>::max() / 2;
  return std::isnan(sum) || (sum > kLow && sum < kHigh);
}

// sqrt(sum of x[i * stride]^2), i < len, without overflow or underflow:
// squares add up in double, which no float can overflow; for doubles out of
// its safe range the sum is redone scaled by the largest magnitude.
template <typename T>
double ColumnNorm(int64_t len, const T* x, int64_t stride) {
  double sum = 0;
  for (int64_t i = 0; i < len; ++i) sum += static_cast<double>(x[i * stride]) * x[i * stride];
  if (SumOfSquaresIsSafe(sum)) return std::sqrt(sum);
  double scale = 0;
  for (int64_t i = 0; i < len; ++i) scale = std::max(scale, std::abs(double(x[i * stride])));
  if (scale == 0 || std::isinf(scale)) return scale;
  sum = 0;
  for (int64_t i = 0; i < len; ++i) {
    const double y = x[i * stride] / scale;
    sum += y * y;
  }
  return scale * std::sqrt(sum);
}

// LAPACK's larfg on the column x[0], x[stride], ... x[(len - 1) * stride]:
// overwrites x[0] with beta, the rest with v (v[0] = 1 implied) such that
// (I - tau v v^T) x = (beta, 0, ..., 0), and returns tau (0: H = I, nothing
// to annihilate). v is formed by division, never by a reciprocal that could
// overflow, which is what larfg's rescaling loop guards against.
template <typename T>
T MakeReflector(int64_t len, T* x, int64_t stride) {
  const double norm = ColumnNorm(len - 1, x + stride, stride);
  if (norm == 0) return T(0);
  const double alpha = x[0];
  const double beta = -std::copysign(std::hypot(alpha, norm), alpha);
  const double divisor = alpha - beta;
  for (int64_t i = 1; i < len; ++i) x[i * stride] = static_cast<T>(x[i * stride] / divisor);
  x[0] = static_cast<T>(beta);
  return static_cast<T>((beta - alpha) / beta);
}

// Applies I - tau v v^T, v = (1, v[vs], v[2 vs], ...), to rows [0, rows)
// of the NV-vector-wide column block at `a` (row stride ld): acc = v^T a
// (two accumulators, so the sum over rows is not one chain of dependent
// adds), then a -= v (tau acc)^T.
template <int NV, typename T>
[[gnu::always_inline]] inline void ReflectBlock(int64_t rows, const T* v, int64_t vs, T tau, T* a,
                                                int64_t ld) {
  constexpr int64_t kWidth = NV * kLanes<T>;
  T even[kWidth], odd[kWidth];
  for (int64_t c = 0; c < kWidth; ++c) even[c] = a[c], odd[c] = T(0);
  int64_t i = 1;
  for (; i + 1 < rows; i += 2) {
    const T v0 = v[i * vs], v1 = v[(i + 1) * vs];
    const T* __restrict r0 = a + i * ld;
    const T* __restrict r1 = r0 + ld;
    for (int64_t c = 0; c < kWidth; ++c) even[c] += v0 * r0[c], odd[c] += v1 * r1[c];
  }
  if (i < rows) {
    const T v0 = v[i * vs];
    const T* __restrict r0 = a + i * ld;
    for (int64_t c = 0; c < kWidth; ++c) even[c] += v0 * r0[c];
  }
  for (int64_t c = 0; c < kWidth; ++c) even[c] = (even[c] + odd[c]) * tau;
  for (int64_t c = 0; c < kWidth; ++c) a[c] -= even[c];
  for (int64_t r = 1; r < rows; ++r) {
    const T vr = v[r * vs];
    T* __restrict row = a + r * ld;
    for (int64_t c = 0; c < kWidth; ++c) row[c] -= vr * even[c];
  }
}

// ReflectBlock over columns [0, cols) of `a` (padded rows), in blocks of
// four vectors and one narrower block for the rest, rounded up to whole vectors.
template <typename T>
[[gnu::always_inline]] inline void Reflect(int64_t rows, int64_t cols, const T* v, int64_t vs,
                                           T tau, T* a, int64_t ld) {
  int64_t vectors = (cols + kLanes<T> - 1) / kLanes<T>;
  for (; vectors >= 4; vectors -= 4, a += 4 * kLanes<T>) ReflectBlock<4>(rows, v, vs, tau, a, ld);
  switch (vectors) {
    case 3:
      ReflectBlock<3>(rows, v, vs, tau, a, ld);
      break;
    case 2:
      ReflectBlock<2>(rows, v, vs, tau, a, ld);
      break;
    case 1:
      ReflectBlock<1>(rows, v, vs, tau, a, ld);
      break;
    default:
      break;
  }
}

// Per-thread buffers of the row-major QR: padded copies of A and Q and the
// reflectors' tau for the Householder path; a column-major copy of A, tau
// and LAPACK's workspace for the LQ path.
template <typename T>
struct RowMajorQrScratch {
  RowMajorQrScratch(const QrShape& shape, int64_t lwork)
      : tau(std::max<int64_t>(1, shape.k)), work(lwork) {
    if (UsesRowMajorHouseholder<T>(shape)) {
      a.resize(shape.m * PaddedRowLength<T>(shape.n));
      q.resize(shape.m * PaddedRowLength<T>(shape.q_cols));
    } else {
      a.resize(shape.m * shape.n);
    }
  }
  AlignedVector<T> a, q, tau, work;
};

// The Householder QR of one real row-major matrix (geqr2, then org2r's
// backward accumulation of Q), into row-major q and r.
template <typename T>
#if defined(__GNUC__) && defined(__x86_64__) && defined(__linux__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
void RowMajorHouseholderQr(const QrShape& shape, const T* a_in, T* q_out, T* r_out,
                           RowMajorQrScratch<T>& s) {
  const int64_t m = shape.m, n = shape.n, k = shape.k, q_cols = shape.q_cols;
  const int64_t lda = PaddedRowLength<T>(n), ldq = PaddedRowLength<T>(q_cols);
  T* a = s.a.data();
  T* q = s.q.data();
  T* tau = s.tau.data();
  for (int64_t i = 0; i < m; ++i) {  // each row, then zeros to the padded length
    std::fill(std::copy_n(a_in + i * n, n, a + i * lda), a + (i + 1) * lda, T(0));
  }
  for (int64_t j = 0; j < k; ++j) {
    T* column = a + j * lda + j;
    tau[j] = MakeReflector(m - j, column, lda);
    if (tau[j] != T(0) && j + 1 < n)
      Reflect(m - j, n - j - 1, column, lda, tau[j], column + 1, lda);
  }
  for (int64_t i = 0; i < shape.r_rows; ++i) {
    for (int64_t c = 0; c < n; ++c) r_out[i * n + c] = c >= i ? a[i * lda + c] : T(0);
  }
  // Q = H(0) ... H(k-1) applied to the first q_cols columns of I, from the
  // last reflector back, as org2r: when H(i) is applied, row i of Q's later
  // columns is still zero and column i is still e_i, so H(i) touches rows
  // i.. of columns i+1.. and column i is written directly.
  std::fill(s.q.begin(), s.q.end(), T(0));
  for (int64_t j = k; j < q_cols; ++j) q[j * ldq + j] = T(1);
  for (int64_t i = k - 1; i >= 0; --i) {
    const T* v = a + i * lda + i;
    if (tau[i] != T(0) && i + 1 < q_cols)
      Reflect(m - i, q_cols - i - 1, v, lda, tau[i], q + i * ldq + i + 1, ldq);
    for (int64_t r = i + 1; r < m; ++r) q[r * ldq + i] = -tau[i] * v[(r - i) * lda];
    q[i * ldq + i] = T(1) - tau[i];
  }
  CopyMatrix(q, ldq, q_out, q_cols, /*rows=*/q_cols, /*cols=*/m);
}

// LAPACK's workspace for LqQr: the larger of gelqf's and orglq's.
template <typename T>
int64_t LqWorkspace(const QrShape& shape) {
  lapack_int rows = static_cast<lapack_int>(shape.n), cols = static_cast<lapack_int>(shape.m);
  lapack_int q_rows = static_cast<lapack_int>(shape.q_cols), k = static_cast<lapack_int>(shape.k);
  lapack_int ld = LeadingDim(shape.n), ldq = LeadingDim(shape.q_cols), query = -1, info = 0;
  T gelqf_size{}, orglq_size{};
  Lapack<T>::gelqf(&rows, &cols, nullptr, &ld, nullptr, &gelqf_size, &query, &info);
  Lapack<T>::orglq(&q_rows, &cols, &k, nullptr, &ldq, nullptr, &orglq_size, &query, &info);
  return std::max(QueriedSize(gelqf_size), QueriedSize(orglq_size));
}

// The QR of one row-major matrix by the LQ factorization of its column-major
// reading, A^T (gelqf on a copy, then orglq/unglq in q's own buffer).
template <typename T>
void LqQr(const QrShape& shape, const T* a_in, T* q, T* r, RowMajorQrScratch<T>& s) {
  const int64_t m = shape.m, n = shape.n, k = shape.k;
  lapack_int rows = static_cast<lapack_int>(n), cols = static_cast<lapack_int>(m);
  lapack_int q_rows = static_cast<lapack_int>(shape.q_cols),
             reflectors = static_cast<lapack_int>(k);
  lapack_int ld = LeadingDim(n), ldq = LeadingDim(shape.q_cols);
  lapack_int lwork = static_cast<lapack_int>(s.work.size()), info = 0;
  T* lq = s.a.data();
  std::copy_n(a_in, m * n, lq);
  Lapack<T>::gelqf(&rows, &cols, lq, &ld, s.tau.data(), s.work.data(), &lwork, &info);
  // R's row j is L's column j, on and below L's diagonal.
  for (int64_t j = 0; j < shape.r_rows; ++j) {
    for (int64_t i = 0; i < n; ++i) r[j * n + i] = j < k && i >= j ? lq[j * n + i] : T(0);
  }
  // Q' takes the reflectors from L Q''s first k rows; orglq writes all of it.
  CopyMatrix(lq, n, q, shape.q_cols, std::min(k, shape.q_cols), m);
  Lapack<T>::orglq(&q_rows, &cols, &reflectors, q, &ldq, s.tau.data(), s.work.data(), &lwork,
                   &info);
}

// The QR of one row-major matrix into row-major q and r, by whichever of
// the two paths above suits its type and size.
template <typename T>
void RowMajorQr(const QrShape& shape, const T* a, T* q, T* r, RowMajorQrScratch<T>& s) {
  if constexpr (!kIsComplex<T>) {
    if (UsesRowMajorHouseholder<T>(shape)) return RowMajorHouseholderQr(shape, a, q, r, s);
  }
  LqQr(shape, a, q, r, s);
}

}  // namespace batchpart::lapack

#endif  // BATCHPART_LAPACK_QR_STEPS_H_
