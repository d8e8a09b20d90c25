#include "lapack/small_qr.h"

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstdint>
#include <cstring>
#include <vector>

#include "lapack/lapack_api.h"
#include "lapack/qr_steps.h"
#include "lapack/scalar_types.h"

namespace batchpart::lapack::interleaved {
namespace {

// Always inlined, so that the kernel compiled per instruction set
// (target_clones) gets each loop compiled for it too.
#define BATCHPART_INLINE [[gnu::always_inline]] inline
// A loop over the lanes: lane l touches index l of each operand only.
#define BATCHPART_LANES _Pragma("GCC ivdep")

// Each lane's reflector scalars: tau (re, im; im zero for real types).
template <typename T>
struct Taus {
  Real<T>* re;
  Real<T>* im;
};

// The norm of rows [j + 1, m) of column j, per lane (larfg's xnorm, as
// nrm2): squares summed in double, and lanes whose sum underflowed or
// overflowed summed again by ColumnNorm, rescaled (unless the column is zero).
template <typename T, int W>
BATCHPART_INLINE void BelowDiagonalNorms(const Planes<T, W>& a, int64_t m, int64_t j,
                                         double* norm) {
  double sum[W] = {}, largest[W] = {};
  for (int64_t i = j + 1; i < m; ++i) {
    const Real<T>* x = a.Re(i, j);
    BATCHPART_LANES
    for (int l = 0; l < W; ++l) {
      sum[l] += static_cast<double>(x[l]) * x[l];
      largest[l] = std::max(largest[l], static_cast<double>(std::abs(x[l])));
    }
    if constexpr (kIsComplex<T>) {
      const Real<T>* y = a.Im(i, j);
      BATCHPART_LANES
      for (int l = 0; l < W; ++l) {
        sum[l] += static_cast<double>(y[l]) * y[l];
        largest[l] = std::max(largest[l], static_cast<double>(std::abs(y[l])));
      }
    }
  }
  bool rescale = false;
  BATCHPART_LANES
  for (int l = 0; l < W; ++l) {
    norm[l] = std::sqrt(sum[l]);
    rescale |= !SumOfSquaresIsSafe(sum[l]) && largest[l] != 0;
  }
  if (!rescale) return;
  const int64_t len = m - j - 1, stride = a.cols * W;
  for (int l = 0; l < W; ++l) {
    if (SumOfSquaresIsSafe(sum[l]) || largest[l] == 0) continue;
    norm[l] = ColumnNorm(len, a.Re(j + 1, j) + l, stride);
    // A complex column's norm: the norms of its real and imaginary parts.
    if constexpr (kIsComplex<T>) {
      norm[l] = std::hypot(norm[l], ColumnNorm(len, a.Im(j + 1, j) + l, stride));
    }
  }
}

// Turns column j of `a`, rows [j, m), into each of its W lanes' reflector
// (W = 1: one matrix's), as larfg does for one matrix: beta (real) on the diagonal, v below it (v's
// first element 1 implied), tau of lane l; tau = 0 where there is nothing to
// annihilate (the column zero below the diagonal and, complex, alpha real):
// H = I, column kept.
template <typename T, int W>
BATCHPART_INLINE void MakeReflectors(const Planes<T, W>& a, int64_t m, int64_t j, Taus<T> tau) {
  using R = Real<T>;
  double norm[W];
  BelowDiagonalNorms(a, m, j, norm);
  // v = x / d, d = alpha - beta; complex, as x * conj(d) / |d|^2 with d
  // scaled by its larger part first (d_re, d_im: d / d_scale), so that |d|^2
  // neither overflows nor underflows.
  double d_re[W];
  [[maybe_unused]] double d_im[W], d_scale[W];
  R* alpha_re = a.Re(j, j);
  [[maybe_unused]] R* alpha_im = kIsComplex<T> ? a.Im(j, j) : nullptr;
  BATCHPART_LANES
  for (int l = 0; l < W; ++l) {
    const double x = alpha_re[l];
    double y = 0, length;
    if constexpr (kIsComplex<T>) {
      y = alpha_im[l];
      // lapy3(x, y, norm) without a call per lane: the largest times the
      // root of the sum of the squared ratios to it.
      const double big = std::max({std::abs(x), std::abs(y), norm[l]});
      const double rx = big == 0 ? 0.0 : x / big, ry = big == 0 ? 0.0 : y / big,
                   rn = big == 0 ? 0.0 : norm[l] / big;
      length = big * std::sqrt(rx * rx + ry * ry + rn * rn);
    } else {
      // hypot(x, norm) likewise: the larger times sqrt(1 + ratio^2).
      const double big = std::max(std::abs(x), norm[l]), small = std::min(std::abs(x), norm[l]);
      const double ratio = big == 0 ? 0.0 : small / big;
      length = big * std::sqrt(1 + ratio * ratio);
    }
    const double beta = -std::copysign(length, x);
    const bool keep = norm[l] == 0 && y == 0;
    const double dr = keep ? 1.0 : x - beta;
    d_re[l] = dr;
    if constexpr (kIsComplex<T>) {
      d_scale[l] = std::max(std::abs(dr), std::abs(y));
      d_re[l] = dr / d_scale[l];
      d_im[l] = y / d_scale[l];  // 0 where keep
    }
    tau.re[l] = keep ? R(0) : static_cast<R>((beta - x) / beta);
    alpha_re[l] = keep ? alpha_re[l] : static_cast<R>(beta);
    if constexpr (kIsComplex<T>) {
      tau.im[l] = keep ? R(0) : static_cast<R>(-y / beta);
      alpha_im[l] = keep ? alpha_im[l] : R(0);
    }
  }
  for (int64_t i = j + 1; i < m; ++i) {
    R* x = a.Re(i, j);
    if constexpr (kIsComplex<T>) {
      R* y = a.Im(i, j);
      BATCHPART_LANES
      for (int l = 0; l < W; ++l) {
        const double den = (d_re[l] * d_re[l] + d_im[l] * d_im[l]) * d_scale[l];
        const double xr = x[l], yi = y[l];
        x[l] = static_cast<R>((xr * d_re[l] + yi * d_im[l]) / den);
        y[l] = static_cast<R>((yi * d_re[l] - xr * d_im[l]) / den);
      }
    } else {
      BATCHPART_LANES
      for (int l = 0; l < W; ++l) x[l] = static_cast<R>(x[l] / d_re[l]);
    }
  }
}

// Applies each lane's I - t v v^H, t = tau or (ConjugateTau) conj(tau), to NB
// columns of `x` from column c (v: rows [0, rows) of the column at `v`,
// v[0] = 1 implied): acc = v^H x, then x -= v (t acc). NB columns at once,
// so that NB sums run as independent chains.
template <typename T, int NB, bool ConjugateTau>
BATCHPART_INLINE void ReflectColumns(int64_t rows, const Planes<T>& v, int64_t v_row,
                                     int64_t v_col, Taus<T> tau, const Planes<T>& x,
                                     int64_t x_row, int64_t c) {
  using V = typename LaneVector<Real<T>>::type;
  V acc[NB];
  [[maybe_unused]] V acc_im[NB];
  for (int q = 0; q < NB; ++q) {
    acc[q] = LoadLanes(x.Re(x_row, c + q));
    if constexpr (kIsComplex<T>) acc_im[q] = LoadLanes(x.Im(x_row, c + q));
  }
  for (int64_t i = 1; i < rows; ++i) {
    const V vr = LoadLanes(v.Re(v_row + i, v_col));
    if constexpr (kIsComplex<T>) {
      const V vi = LoadLanes(v.Im(v_row + i, v_col));
      for (int q = 0; q < NB; ++q) {
        const V xr = LoadLanes(x.Re(x_row + i, c + q)), xi = LoadLanes(x.Im(x_row + i, c + q));
        acc[q] += vr * xr + vi * xi;
        acc_im[q] += vr * xi - vi * xr;
      }
    } else {
      for (int q = 0; q < NB; ++q) acc[q] += vr * LoadLanes(x.Re(x_row + i, c + q));
    }
  }
  const V tr = LoadLanes(tau.re);
  [[maybe_unused]] V ti;
  if constexpr (kIsComplex<T>) ti = ConjugateTau ? -LoadLanes(tau.im) : LoadLanes(tau.im);
  for (int q = 0; q < NB; ++q) {
    if constexpr (kIsComplex<T>) {
      const V ar = acc[q];
      acc[q] = tr * ar - ti * acc_im[q];
      acc_im[q] = tr * acc_im[q] + ti * ar;
      StoreLanes(x.Im(x_row, c + q), LoadLanes(x.Im(x_row, c + q)) - acc_im[q]);
    } else {
      acc[q] *= tr;
    }
    StoreLanes(x.Re(x_row, c + q), LoadLanes(x.Re(x_row, c + q)) - acc[q]);
  }
  for (int64_t i = 1; i < rows; ++i) {
    const V vr = LoadLanes(v.Re(v_row + i, v_col));
    if constexpr (kIsComplex<T>) {
      const V vi = LoadLanes(v.Im(v_row + i, v_col));
      for (int q = 0; q < NB; ++q) {
        StoreLanes(x.Re(x_row + i, c + q),
                   LoadLanes(x.Re(x_row + i, c + q)) - (vr * acc[q] - vi * acc_im[q]));
        StoreLanes(x.Im(x_row + i, c + q),
                   LoadLanes(x.Im(x_row + i, c + q)) - (vr * acc_im[q] + vi * acc[q]));
      }
    } else {
      for (int q = 0; q < NB; ++q) {
        StoreLanes(x.Re(x_row + i, c + q), LoadLanes(x.Re(x_row + i, c + q)) - vr * acc[q]);
      }
    }
  }
}

// ReflectColumns over columns [c_begin, c_end) of x, four at a time.
template <typename T, bool ConjugateTau>
BATCHPART_INLINE void Reflect(int64_t rows, const Planes<T>& v, int64_t v_row, int64_t v_col,
                              Taus<T> tau, const Planes<T>& x, int64_t x_row, int64_t c_begin,
                              int64_t c_end) {
  int64_t c = c_begin;
  for (; c + 4 <= c_end; c += 4) {
    ReflectColumns<T, 4, ConjugateTau>(rows, v, v_row, v_col, tau, x, x_row, c);
  }
  switch (c_end - c) {
    case 3:
      return ReflectColumns<T, 3, ConjugateTau>(rows, v, v_row, v_col, tau, x, x_row, c);
    case 2:
      return ReflectColumns<T, 2, ConjugateTau>(rows, v, v_row, v_col, tau, x, x_row, c);
    case 1:
      return ReflectColumns<T, 1, ConjugateTau>(rows, v, v_row, v_col, tau, x, x_row, c);
    default:
      return;
  }
}

// geqr2 then org2r (ung2r) on the lanes: `a` (m x n) holds the reflectors
// afterwards, `q` the first q_cols columns of Q, `r` R's first r_rows rows.
template <typename T>
#if defined(__GNUC__) && defined(__x86_64__) && defined(__linux__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
void QrLanes(int64_t m, int64_t n, Planes<T> a, Planes<T> q, int64_t r_rows, Planes<T> r) {
  using R = Real<T>;
  using V = typename LaneVector<R>::type;
  constexpr int W = kLanes<T>;
  constexpr int kParts = kIsComplex<T> ? 2 : 1;
  const int64_t k = std::min(m, n), q_cols = q.cols;
  // Each reflector's tau per lane (re, then im for complex types): on the
  // stack up to the sizes the switch points send here, on the heap for a
  // forced larger call.
  constexpr int64_t kStackReflectors = 64;
  alignas(64) R stack_tau[kStackReflectors * W * kParts];
  std::vector<R> heap_tau(k > kStackReflectors ? k * W * kParts : 0);
  R* tau_data = k > kStackReflectors ? heap_tau.data() : stack_tau;
  const auto tau = [&](int64_t j) {
    return Taus<T>{tau_data + j * W * kParts, tau_data + j * W * kParts + (kParts - 1) * W};
  };
  // geqr2 applies each H(j)^H to the columns on its right.
  for (int64_t j = 0; j < k; ++j) {
    MakeReflectors(a, m, j, tau(j));
    Reflect<T, /*ConjugateTau=*/true>(m - j, a, j, j, tau(j), a, j, j + 1, n);
  }
  for (int64_t i = 0; i < r_rows; ++i) {
    for (int64_t c = 0; c < n; ++c) {
      StoreLanes(r.Re(i, c), c >= i ? LoadLanes(a.Re(i, c)) : V{});
      if constexpr (kIsComplex<T>) StoreLanes(r.Im(i, c), c >= i ? LoadLanes(a.Im(i, c)) : V{});
    }
  }
  // Q = H(0) ... H(k-1) applied to the first q_cols columns of I, from the
  // last reflector back, as org2r: when H(i) is applied, row i of Q's later
  // columns is still zero and column i is still e_i, so H(i) touches rows
  // i.. of columns i+1.. and column i is written directly (-tau v, 1 - tau).
  std::memset(q.re, 0, sizeof(R) * m * q_cols * W);
  if constexpr (kIsComplex<T>) std::memset(q.im, 0, sizeof(R) * m * q_cols * W);
  for (int64_t j = k; j < q_cols; ++j) StoreLanes(q.Re(j, j), V{} + R(1));
  for (int64_t i = k - 1; i >= 0; --i) {
    const V tr = LoadLanes(tau(i).re);
    Reflect<T, /*ConjugateTau=*/false>(m - i, a, i, i, tau(i), q, i, i + 1, q_cols);
    if constexpr (kIsComplex<T>) {
      const V ti = LoadLanes(tau(i).im);
      for (int64_t row = i + 1; row < m; ++row) {
        const V vr = LoadLanes(a.Re(row, i)), vi = LoadLanes(a.Im(row, i));
        StoreLanes(q.Re(row, i), -(tr * vr - ti * vi));
        StoreLanes(q.Im(row, i), -(tr * vi + ti * vr));
      }
      StoreLanes(q.Im(i, i), -ti);
    } else {
      for (int64_t row = i + 1; row < m; ++row) {
        StoreLanes(q.Re(row, i), -tr * LoadLanes(a.Re(row, i)));
      }
    }
    StoreLanes(q.Re(i, i), R(1) - tr);
  }
}

// ReflectColumns on one row-major matrix (W = 1 planes), over columns
// [c_begin, c_end) of x together: each column takes ReflectColumns'
// operations in its order, and the columns' sums run as one loop along the
// rows, so that they are independent chains. `sums` holds two rows of them
// (re, then im).
template <typename T, bool ConjugateTau>
BATCHPART_INLINE void ReflectOne(int64_t rows, const Planes<T, 1>& v, int64_t v_row, int64_t v_col,
                                 Taus<T> tau, const Planes<T, 1>& x, int64_t x_row, int64_t c_begin,
                                 int64_t c_end, Real<T>* sums) {
  using R = Real<T>;
  const int64_t count = c_end - c_begin;
  R* __restrict acc_re = sums;
  R* __restrict acc_im = sums + count;
  const R* __restrict top_re = x.Re(x_row, c_begin);
  for (int64_t c = 0; c < count; ++c) acc_re[c] = top_re[c];
  if constexpr (kIsComplex<T>) {
    const R* __restrict top_im = x.Im(x_row, c_begin);
    for (int64_t c = 0; c < count; ++c) acc_im[c] = top_im[c];
  }
  for (int64_t i = 1; i < rows; ++i) {
    const R vr = *v.Re(v_row + i, v_col);
    const R* __restrict xr = x.Re(x_row + i, c_begin);
    if constexpr (kIsComplex<T>) {
      const R vi = *v.Im(v_row + i, v_col);
      const R* __restrict xi = x.Im(x_row + i, c_begin);
      for (int64_t c = 0; c < count; ++c) {
        acc_re[c] += vr * xr[c] + vi * xi[c];
        acc_im[c] += vr * xi[c] - vi * xr[c];
      }
    } else {
      for (int64_t c = 0; c < count; ++c) acc_re[c] += vr * xr[c];
    }
  }
  const R tr = *tau.re;
  R* __restrict top = x.Re(x_row, c_begin);
  if constexpr (kIsComplex<T>) {
    const R ti = ConjugateTau ? -*tau.im : *tau.im;
    R* __restrict top_im = x.Im(x_row, c_begin);
    for (int64_t c = 0; c < count; ++c) {
      const R ar = acc_re[c];
      acc_re[c] = tr * ar - ti * acc_im[c];
      acc_im[c] = tr * acc_im[c] + ti * ar;
      top_im[c] = top_im[c] - acc_im[c];
    }
  } else {
    for (int64_t c = 0; c < count; ++c) acc_re[c] *= tr;
  }
  for (int64_t c = 0; c < count; ++c) top[c] = top[c] - acc_re[c];
  for (int64_t i = 1; i < rows; ++i) {
    const R vr = *v.Re(v_row + i, v_col);
    R* __restrict xr = x.Re(x_row + i, c_begin);
    if constexpr (kIsComplex<T>) {
      const R vi = *v.Im(v_row + i, v_col);
      R* __restrict xi = x.Im(x_row + i, c_begin);
      for (int64_t c = 0; c < count; ++c) {
        xr[c] = xr[c] - (vr * acc_re[c] - vi * acc_im[c]);
        xi[c] = xi[c] - (vr * acc_im[c] + vi * acc_re[c]);
      }
    } else {
      for (int64_t c = 0; c < count; ++c) xr[c] = xr[c] - vr * acc_re[c];
    }
  }
}

// QrLanes on one row-major matrix (W = 1 planes): the same reflectors, R
// and Q, bit for bit. `scratch` holds k taus (re, then im) and ReflectOne's
// two rows of sums.
template <typename T>
#if defined(__GNUC__) && defined(__x86_64__) && defined(__linux__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
void QrOneLanes(int64_t m, int64_t n, Planes<T, 1> a, Planes<T, 1> q, int64_t r_rows,
                Planes<T, 1> r, Real<T>* scratch) {
  using R = Real<T>;
  const int64_t k = std::min(m, n), q_cols = q.cols;
  R* tau_re = scratch;
  R* tau_im = tau_re + k;
  R* sums = tau_im + k;
  const auto tau = [&](int64_t j) { return Taus<T>{tau_re + j, tau_im + j}; };
  for (int64_t j = 0; j < k; ++j) {
    MakeReflectors(a, m, j, tau(j));
    ReflectOne<T, /*ConjugateTau=*/true>(m - j, a, j, j, tau(j), a, j, j + 1, n, sums);
  }
  for (int64_t i = 0; i < r_rows; ++i) {
    for (int64_t c = 0; c < n; ++c) {
      *r.Re(i, c) = c >= i ? *a.Re(i, c) : R(0);
      if constexpr (kIsComplex<T>) *r.Im(i, c) = c >= i ? *a.Im(i, c) : R(0);
    }
  }
  std::fill_n(q.re, m * q_cols, R(0));
  if constexpr (kIsComplex<T>) std::fill_n(q.im, m * q_cols, R(0));
  for (int64_t j = k; j < q_cols; ++j) *q.Re(j, j) = R(1);
  for (int64_t i = k - 1; i >= 0; --i) {
    const R tr = tau_re[i];
    ReflectOne<T, /*ConjugateTau=*/false>(m - i, a, i, i, tau(i), q, i, i + 1, q_cols, sums);
    if constexpr (kIsComplex<T>) {
      const R ti = tau_im[i];
      for (int64_t row = i + 1; row < m; ++row) {
        const R vr = *a.Re(row, i), vi = *a.Im(row, i);
        *q.Re(row, i) = -(tr * vr - ti * vi);
        *q.Im(row, i) = -(tr * vi + ti * vr);
      }
      *q.Im(i, i) = -ti;
    } else {
      for (int64_t row = i + 1; row < m; ++row) *q.Re(row, i) = -tr * *a.Re(row, i);
    }
    *q.Re(i, i) = R(1) - tr;
  }
}

#undef BATCHPART_INLINE
#undef BATCHPART_LANES

}  // namespace

template <typename T>
void QrGroup(Group<T>& a, Group<T>& q, Group<T>& r) {
  const auto planes = [](Group<T>& g) {
    return Planes<T>{g.re(0, 0), kIsComplex<T> ? g.im(0, 0) : nullptr, g.cols()};
  };
  QrLanes<T>(a.rows(), a.cols(), planes(a), planes(q), r.rows(), planes(r));
}

template <typename T>
void QrOne(Group<T, 1>& a, Group<T, 1>& q, Group<T, 1>& r, std::vector<Real<T>>& scratch) {
  const auto planes = [](Group<T, 1>& g) {
    return Planes<T, 1>{g.re(0, 0), kIsComplex<T> ? g.im(0, 0) : nullptr, g.cols()};
  };
  scratch.resize(2 * std::min(a.rows(), a.cols()) + 2 * std::max(a.cols(), q.cols()));
  QrOneLanes<T>(a.rows(), a.cols(), planes(a), planes(q), r.rows(), planes(r), scratch.data());
}

#define BATCHPART_INSTANTIATE(T)                             \
  template void QrGroup<T>(Group<T>&, Group<T>&, Group<T>&); \
  template void QrOne<T>(Group<T, 1>&, Group<T, 1>&, Group<T, 1>&, std::vector<Real<T>>&);
BATCHPART_FOR_EACH_SCALAR(BATCHPART_INSTANTIATE)
#undef BATCHPART_INSTANTIATE

}  // namespace batchpart::lapack::interleaved
