#include "lapack/small_qr.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "lapack/lapack_api.h"
#include "lapack/qr_steps.h"

namespace batchpart::lapack::interleaved {
namespace {

// Always inlined, so that the kernel compiled per instruction set
// (target_clones) gets each loop compiled for it too.
#define BATCHPART_INLINE [[gnu::always_inline]] inline
// A loop over the lanes: lane l touches index l of each operand only.
#define BATCHPART_LANES _Pragma("GCC ivdep")

// Turns column j of `a`, rows [j, m), into each lane's reflector, as
// MakeReflector does for one matrix: beta on the diagonal, v below it (v's
// first element 1 implied), tau[l] of lane l; tau = 0 where the column is
// already zero below the diagonal (nothing to annihilate, column kept).
template <typename T>
BATCHPART_INLINE void MakeReflectors(const Planes<T>& a, int64_t m, int64_t j, T* tau) {
  constexpr int W = kLanes<T>;
  double sum[W] = {}, largest[W] = {};
  for (int64_t i = j + 1; i < m; ++i) {
    const T* x = a.Re(i, j);
    BATCHPART_LANES
    for (int l = 0; l < W; ++l) {
      sum[l] += static_cast<double>(x[l]) * x[l];
      largest[l] = std::max(largest[l], static_cast<double>(std::abs(x[l])));
    }
  }
  // Lanes whose squares underflowed or overflowed are summed again,
  // rescaled, by ColumnNorm (unless the column is zero).
  double norm[W];
  bool rescale = false;
  BATCHPART_LANES
  for (int l = 0; l < W; ++l) {
    norm[l] = std::sqrt(sum[l]);
    rescale |= !SumOfSquaresIsSafe(sum[l]) && largest[l] != 0;
  }
  if (rescale) {
    for (int l = 0; l < W; ++l) {
      if (!SumOfSquaresIsSafe(sum[l]) && largest[l] != 0) {
        norm[l] = ColumnNorm(m - j - 1, a.Re(j + 1, j) + l, a.cols * W);
      }
    }
  }
  double divisor[W];
  T* alpha = a.Re(j, j);
  BATCHPART_LANES
  for (int l = 0; l < W; ++l) {
    const double x = alpha[l];
    // hypot(x, norm) without a call per lane: the larger times
    // sqrt(1 + ratio^2), which neither overflows nor underflows.
    const double big = std::max(std::abs(x), norm[l]), small = std::min(std::abs(x), norm[l]);
    const double ratio = big == 0 ? 0.0 : small / big;
    const double beta = -std::copysign(big * std::sqrt(1 + ratio * ratio), x);
    const bool keep = norm[l] == 0;
    divisor[l] = keep ? 1.0 : x - beta;
    tau[l] = keep ? T(0) : static_cast<T>((beta - x) / beta);
    alpha[l] = keep ? alpha[l] : static_cast<T>(beta);
  }
  for (int64_t i = j + 1; i < m; ++i) {
    T* x = a.Re(i, j);
    BATCHPART_LANES
    for (int l = 0; l < W; ++l) x[l] = static_cast<T>(x[l] / divisor[l]);
  }
}

// Applies each lane's I - tau v v^T (v: rows [0, rows) of the column at
// `v`, v[0] = 1 implied) to NB columns of `x` from column c: acc = v^T x,
// then x -= v (tau acc)^T. NB columns at once, so that NB sums run as
// independent chains.
template <typename T, int NB>
BATCHPART_INLINE void ReflectColumns(int64_t rows, const Planes<T>& v, int64_t v_row,
                                     int64_t v_col, const T* tau, const Planes<T>& x,
                                     int64_t x_row, int64_t c) {
  using V = typename LaneVector<T>::type;
  V acc[NB];
  for (int q = 0; q < NB; ++q) acc[q] = LoadLanes(x.Re(x_row, c + q));
  for (int64_t i = 1; i < rows; ++i) {
    const V vi = LoadLanes(v.Re(v_row + i, v_col));
    for (int q = 0; q < NB; ++q) acc[q] += vi * LoadLanes(x.Re(x_row + i, c + q));
  }
  const V t = LoadLanes(tau);
  for (int q = 0; q < NB; ++q) {
    acc[q] *= t;
    StoreLanes(x.Re(x_row, c + q), LoadLanes(x.Re(x_row, c + q)) - acc[q]);
  }
  for (int64_t i = 1; i < rows; ++i) {
    const V vi = LoadLanes(v.Re(v_row + i, v_col));
    for (int q = 0; q < NB; ++q) {
      StoreLanes(x.Re(x_row + i, c + q), LoadLanes(x.Re(x_row + i, c + q)) - vi * acc[q]);
    }
  }
}

// ReflectColumns over columns [c_begin, c_end) of x, four at a time.
template <typename T>
BATCHPART_INLINE void Reflect(int64_t rows, const Planes<T>& v, int64_t v_row, int64_t v_col,
                              const T* tau, const Planes<T>& x, int64_t x_row, int64_t c_begin,
                              int64_t c_end) {
  int64_t c = c_begin;
  for (; c + 4 <= c_end; c += 4) ReflectColumns<T, 4>(rows, v, v_row, v_col, tau, x, x_row, c);
  switch (c_end - c) {
    case 3:
      return ReflectColumns<T, 3>(rows, v, v_row, v_col, tau, x, x_row, c);
    case 2:
      return ReflectColumns<T, 2>(rows, v, v_row, v_col, tau, x, x_row, c);
    case 1:
      return ReflectColumns<T, 1>(rows, v, v_row, v_col, tau, x, x_row, c);
    default:
      return;
  }
}

template <typename T>
#if defined(__GNUC__) && defined(__x86_64__) && defined(__linux__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
void QrLanes(int64_t m, int64_t n, T* a_data, int64_t q_cols, T* q_data, int64_t r_rows,
             T* r_data) {
  using V = typename LaneVector<T>::type;
  constexpr int W = kLanes<T>;
  const Planes<T> a{a_data, nullptr, n}, q{q_data, nullptr, q_cols}, r{r_data, nullptr, n};
  const int64_t k = std::min(m, n);
  // Each reflector's tau per lane: on the stack up to the sizes the
  // switch points send here, on the heap for a forced larger call.
  constexpr int64_t kStackReflectors = 64;
  alignas(64) T stack_tau[kStackReflectors * W];
  std::vector<T> heap_tau(k > kStackReflectors ? k * W : 0);
  T* tau = k > kStackReflectors ? heap_tau.data() : stack_tau;
  for (int64_t j = 0; j < k; ++j) {
    MakeReflectors(a, m, j, tau + j * W);
    Reflect(m - j, a, j, j, tau + j * W, a, j, j + 1, n);
  }
  for (int64_t i = 0; i < r_rows; ++i) {
    for (int64_t c = 0; c < n; ++c) StoreLanes(r.Re(i, c), c >= i ? LoadLanes(a.Re(i, c)) : V{});
  }
  // Q = H(0) ... H(k-1) applied to the first q_cols columns of I, from the
  // last reflector back, as org2r: when H(i) is applied, row i of Q's later
  // columns is still zero and column i is still e_i, so H(i) touches rows
  // i.. of columns i+1.. and column i is written directly.
  std::memset(q_data, 0, sizeof(T) * m * q_cols * W);
  for (int64_t j = k; j < q_cols; ++j) StoreLanes(q.Re(j, j), V{} + T(1));
  for (int64_t i = k - 1; i >= 0; --i) {
    const V t = LoadLanes(tau + i * W);
    Reflect(m - i, a, i, i, tau + i * W, q, i, i + 1, q_cols);
    for (int64_t row = i + 1; row < m; ++row) {
      StoreLanes(q.Re(row, i), -t * LoadLanes(a.Re(row, i)));
    }
    StoreLanes(q.Re(i, i), T(1) - t);
  }
}

#undef BATCHPART_INLINE
#undef BATCHPART_LANES

}  // namespace

template <typename T>
void QrGroup(Group<T>& a, Group<T>& q, Group<T>& r) {
  QrLanes<T>(a.rows(), a.cols(), a.re(0, 0), q.cols(), q.re(0, 0), r.rows(), r.re(0, 0));
}

template void QrGroup<float>(Group<float>&, Group<float>&, Group<float>&);
template void QrGroup<double>(Group<double>&, Group<double>&, Group<double>&);

}  // namespace batchpart::lapack::interleaved
