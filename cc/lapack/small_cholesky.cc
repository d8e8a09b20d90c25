#include "lapack/small_cholesky.h"

#include <atomic>
#include <cmath>
#include <complex>
#include <cstdint>
#include <cstring>
#include <limits>

#include "lapack/scalar_types.h"
#include "lapack/small_cholesky_fixed.h"

namespace batchpart::lapack::interleaved {
namespace {

// The cut-off, measured single-threaded through jax on one CPU device
// (benchmarks/small_cholesky.py switch [--posv]: 1024 matrices, 2 shared
// x86-64 cores with AVX-512, scipy 1.17's OpenBLAS; microseconds per matrix,
// the least of 9 runs, LAPACK path / interleaved):
//
//    n  | potrf f64   | potrf f32   | posv f64, 1 rhs | posv f32, 1 rhs
//   ----+-------------+-------------+-----------------+----------------
//    2  | 0.051 0.016 | 0.051 0.012 |   0.148 0.023   |   0.147 0.015
//    4  | 0.105 0.035 | 0.114 0.015 |   0.199 0.047   |   0.226 0.020
//    8  | 0.201 0.094 | 0.242 0.053 |   0.321 0.047   |   0.405 0.055
//   16  | 0.779 0.524 | 0.553 0.105 |   1.067 0.338   |   0.949 0.062
//   24  | 1.572 0.918 | 1.165 0.492 |   2.056 0.886   |   1.538 0.470
//   28  | 2.064 1.300 | 1.458 0.682 |   2.925 1.398   |   2.032 0.618
//   32  | 2.575 1.763 | 1.741 0.970 |   3.247 1.780   |   2.047 0.676
//   40  | 4.796 2.562 | 3.803 1.105 |   4.636 1.348   |   4.767 1.465
//   48  | 6.627 3.556 | 4.692 1.833 |   6.261 2.005   |   6.319 2.116
//   64  | 27.57 24.63 | 8.103 3.275 |   28.31 16.61   |   10.71 5.351
//
// The interleaved kernels stay ahead at every n here (complex too, on both
// cores: 1.3-1.8x at n = 32 and 40), but they stop at 32: up to there
// OpenBLAS's potrf runs its unblocked potf2, the algorithm this kernel
// mirrors, so even a matrix with infinite entries gets the same info on
// both paths; above it the blocked potrf meets them in another order (an
// all-inf 48 x 48 matrix fails there at pivot 13, here not at all).
constexpr int64_t kMaxSize = 32;
// A group of kLanes matrices costs about as much as a full one; through jax
// (7-8 us per call) groups of 4 came out even with one call per matrix and
// 6 or more faster (benchmarks/small_cholesky.py batch), so smaller groups
// factor their matrices one by one (FactorLowerOne).
constexpr int64_t kMinGroup = 4;

// Whether n x n matrices go interleaved: by size alone, so that a matrix
// gets the same bits in any batch.
bool UseInterleaved(int64_t n) {
  return n >= 1 && UseSmallPath(SmallKernel::kCholesky, n <= kMaxSize);
}

}  // namespace

bool UseSmallCholesky(int64_t n) { return UseInterleaved(n); }

bool UseSmallPosv(int64_t n) { return UseInterleaved(n); }

int64_t SmallCholeskyMaxSize() { return kMaxSize; }
int64_t SmallPosvMaxSize() { return kMaxSize; }
int64_t SmallCholeskyMinGroup() { return kMinGroup; }

namespace {

// The loops below are over the W lanes of one element (constexpr W): each
// compiles to one or two SIMD instructions. Compiled once per instruction set
// where the compiler can pick at load time (the wheel targets a baseline
// x86-64 CPU). sqrt vectorizes because this file is built with
// -fno-math-errno (CMakeLists.txt).
#if defined(__GNUC__) && defined(__x86_64__) && defined(__linux__)
#define BATCHPART_SMALL_CHOLESKY_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define BATCHPART_SMALL_CHOLESKY_CLONES
#endif

// Rows [i, i + Q) of column j of the factor (j < i): a(i, j) (with
// Symmetrize, (a(i, j) + conj(a(j, i))) / 2, as SymmetrizeTriangle in
// kernel_helpers.h computes it, so both paths factor the same numbers; the
// upper triangle is not written before the factor is done) minus the
// sum over k < j of l(i, k) conj(l(j, k)), in k order as LAPACK's potf2
// sums, times `inverse` (1 / l(j, j)); the layout as FactorPlanes. Each
// row's sum is one chain of dependent multiply-adds; Q of them at once keep
// the SIMD units busy.
template <typename T, int Q, bool Symmetrize>
__attribute__((always_inline)) inline void ColumnRows(int64_t n, int64_t i, int64_t j,
                                                      Real<T>* __restrict re,
                                                      Real<T>* __restrict im,
                                                      const Real<T>* inverse_lanes) {
  using R = Real<T>;
  using V = typename LaneVector<R>::type;
  constexpr int W = kLanes<T>;
  const R* rj = re + j * n * W;
  [[maybe_unused]] const R* ij = im + j * n * W;
  V acc_re[Q];
  [[maybe_unused]] V acc_im[Q];
  for (int q = 0; q < Q; ++q) {
    acc_re[q] = LoadLanes(re + ((i + q) * n + j) * W);
    if constexpr (kIsComplex<T>) acc_im[q] = LoadLanes(im + ((i + q) * n + j) * W);
    if constexpr (Symmetrize) {
      acc_re[q] = Rounded((acc_re[q] + LoadLanes(re + (j * n + i + q) * W)) / R(2));
      if constexpr (kIsComplex<T>) {
        acc_im[q] = Rounded((acc_im[q] - LoadLanes(im + (j * n + i + q) * W)) / R(2));
      }
    }
  }
  for (int64_t k = 0; k < j; ++k) {
    const V br = LoadLanes(rj + k * W);
    for (int q = 0; q < Q; ++q) {
      const V ar = LoadLanes(re + ((i + q) * n + k) * W);
      if constexpr (kIsComplex<T>) {
        const V bi = LoadLanes(ij + k * W);
        const V ai = LoadLanes(im + ((i + q) * n + k) * W);
        acc_re[q] -= ar * br + ai * bi;
        acc_im[q] -= ai * br - ar * bi;
      } else {
        acc_re[q] -= ar * br;
      }
    }
  }
  // As the LAPACK path's scal (OpenBLAS): a zero scale (an infinite pivot)
  // writes zeros, where inf * 0 would be NaN.
  // Then each row's diagonal loses |l(i, j)|^2, the next term of its own sum
  // in the same k order, here where the rows' updates are independent.
  const V inverse = LoadLanes(inverse_lanes);
  for (int q = 0; q < Q; ++q) {
    const V out_re = inverse == V{} ? V{} : acc_re[q] * inverse;
    StoreLanes(re + ((i + q) * n + j) * W, out_re);
    R* diagonal = re + ((i + q) * n + i + q) * W;
    V d = LoadLanes(diagonal) - out_re * out_re;
    if constexpr (kIsComplex<T>) {
      const V out_im = inverse == V{} ? V{} : acc_im[q] * inverse;
      StoreLanes(im + ((i + q) * n + j) * W, out_im);
      d -= out_im * out_im;
    }
    StoreLanes(diagonal, d);
  }
}

// Left-looking Cholesky of the lower triangle of n x n lanes, element (i, j)
// at (i * n + j) * W of `re` (and `im`, complex only), of (A + A^H) / 2 with
// Symmetrize; info as FactorLower.
template <typename T, bool Symmetrize>
BATCHPART_SMALL_CHOLESKY_CLONES void FactorPlanes(int64_t n, Real<T>* __restrict re,
                                                  Real<T>* __restrict im, int32_t* info) {
  using R = Real<T>;
  constexpr int W = kLanes<T>;
  if constexpr (Symmetrize) {
    // The diagonal's (a + conj(a)) / 2 up front: ColumnRows updates it
    // before its column comes.
    for (int64_t j = 0; j < n; ++j) {
      R* d = re + (j * n + j) * W;
      for (int l = 0; l < W; ++l) d[l] = (d[l] + d[l]) / R(2);
    }
  }
  for (int64_t j = 0; j < n; ++j) {
    R* rj = re + j * n * W;
    [[maybe_unused]] R* ij = im + j * n * W;
    // The diagonal: a(j, j) - sum_k |l(j, k)|^2, which ColumnRows has
    // subtracted term by term (the imaginary part of a complex diagonal is
    // not read, as in LAPACK).
    R d[W];
    for (int l = 0; l < W; ++l) d[l] = rj[j * W + l];
    for (int l = 0; l < W; ++l) {
      if (info[l] == 0 && !(d[l] > R(0))) info[l] = static_cast<int32_t>(j + 1);
    }
    R inverse[W];
    for (int l = 0; l < W; ++l) {
      const R s = std::sqrt(d[l]);
      rj[j * W + l] = s;
      inverse[l] = R(1) / s;
    }
    if constexpr (kIsComplex<T>) {
      for (int l = 0; l < W; ++l) ij[j * W + l] = R(0);
    }
    // The column below: (a(i, j) - sum_k l(i, k) conj(l(j, k))) / l(j, j),
    // four rows at a time: each row's sum is one chain of dependent
    // multiply-adds, and four of them keep the SIMD units busy.
    int64_t i = j + 1;
    for (; i + 4 <= n; i += 4) ColumnRows<T, 4, Symmetrize>(n, i, j, re, im, inverse);
    for (; i < n; ++i) ColumnRows<T, 1, Symmetrize>(n, i, j, re, im, inverse);
  }
}

// Step k of a substitution on column c of `x` (element (i, c) at
// (i * r + c) * W): x(k) times 1 / l(k, k), then taken off rows [i_begin,
// i_end): x(i) -= l(i, k) x(k), or with Transposed x(i) -= conj(l(k, i))
// x(k). L is as FactorPlanes leaves it.
template <typename T, bool Transposed>
__attribute__((always_inline)) inline void SubstituteStep(
    int64_t n, int64_t r, int64_t c, int64_t k, int64_t i_begin, int64_t i_end,
    const Real<T>* __restrict lr, const Real<T>* __restrict li, Real<T>* __restrict xr,
    Real<T>* __restrict xi) {
  using R = Real<T>;
  using V = typename LaneVector<R>::type;
  constexpr int W = kLanes<T>;
  const V inverse = (V{} + R(1)) / LoadLanes(lr + (k * n + k) * W);
  R* xk_re = xr + (k * r + c) * W;
  const V x_re = LoadLanes(xk_re) * inverse;
  StoreLanes(xk_re, x_re);
  [[maybe_unused]] V x_im;
  if constexpr (kIsComplex<T>) {
    R* xk_im = xi + (k * r + c) * W;
    x_im = LoadLanes(xk_im) * inverse;
    StoreLanes(xk_im, x_im);
  }
  for (int64_t i = i_begin; i < i_end; ++i) {
    const int64_t at = (Transposed ? k * n + i : i * n + k) * W;
    const V a_re = LoadLanes(lr + at);
    R* out_re = xr + (i * r + c) * W;
    if constexpr (kIsComplex<T>) {
      const V a_im = LoadLanes(li + at);
      R* out_im = xi + (i * r + c) * W;
      if constexpr (Transposed) {
        StoreLanes(out_re, LoadLanes(out_re) - (a_re * x_re + a_im * x_im));
        StoreLanes(out_im, LoadLanes(out_im) - (a_re * x_im - a_im * x_re));
      } else {
        StoreLanes(out_re, LoadLanes(out_re) - (a_re * x_re - a_im * x_im));
        StoreLanes(out_im, LoadLanes(out_im) - (a_re * x_im + a_im * x_re));
      }
    } else {
      StoreLanes(out_re, LoadLanes(out_re) - a_re * x_re);
    }
  }
}

// Forward then back substitution L Y = B, L^H X = Y on n x r lanes of `x`
// (element (i, c) at (i * r + c) * W), L as FactorPlanes leaves it. Column
// by column: once x(k, c) is known it is taken off every row still to come,
// so the updates of one step are independent rather than one chain.
template <typename T>
BATCHPART_SMALL_CHOLESKY_CLONES void SolvePlanes(int64_t n, int64_t r, const Real<T>* __restrict lr,
                                                 const Real<T>* __restrict li,
                                                 Real<T>* __restrict xr, Real<T>* __restrict xi) {
  for (int64_t c = 0; c < r; ++c) {
    for (int64_t k = 0; k < n; ++k) SubstituteStep<T, false>(n, r, c, k, k + 1, n, lr, li, xr, xi);
    for (int64_t k = n; k-- > 0;) SubstituteStep<T, true>(n, r, c, k, 0, k, lr, li, xr, xi);
  }
}

// Zeros above the diagonal, and NaN everywhere in the lanes whose info
// says the factorization failed.
template <typename T>
BATCHPART_SMALL_CHOLESKY_CLONES void FinishPlanes(int64_t n, Real<T>* __restrict re,
                                                  Real<T>* __restrict im, const int32_t* info) {
  using R = Real<T>;
  constexpr int W = kLanes<T>;
  bool failed = false;
  R keep[W];
  for (int l = 0; l < W; ++l) {
    failed |= info[l] != 0;
    keep[l] = info[l] == 0 ? R(1) : R(0);
  }
  const R nan = std::numeric_limits<R>::quiet_NaN();
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      R* x = re + (i * n + j) * W;
      [[maybe_unused]] R* y = im + (i * n + j) * W;
      if (j > i) {
        for (int l = 0; l < W; ++l) x[l] = R(0);
        if constexpr (kIsComplex<T>) {
          for (int l = 0; l < W; ++l) y[l] = R(0);
        }
      }
      if (!failed) continue;
      for (int l = 0; l < W; ++l) x[l] = keep[l] != 0 ? x[l] : nan;
      if constexpr (kIsComplex<T>) {
        for (int l = 0; l < W; ++l) y[l] = keep[l] != 0 ? y[l] : nan;
      }
    }
  }
}

// Rows [i, i + Q) of column j of one matrix held as FactorOnePlanes holds
// it: ColumnRows' operations on each element, in its order, the Q sums kept
// in registers across the k loop (one vector of them for Q = kLanes<T>).
template <typename T, int Q, bool Symmetrize>
[[gnu::always_inline]] inline void ColumnRowsOne(int64_t n, int64_t i, int64_t j,
                                                 Real<T>* __restrict re, Real<T>* __restrict im,
                                                 Real<T> inverse) {
  using R = Real<T>;
  R acc_re[Q];
  [[maybe_unused]] R acc_im[Q];
  for (int q = 0; q < Q; ++q) {
    acc_re[q] = re[j * n + i + q];
    if constexpr (kIsComplex<T>) acc_im[q] = im[j * n + i + q];
    if constexpr (Symmetrize) {
      acc_re[q] = (acc_re[q] + re[(i + q) * n + j]) / R(2);
      if constexpr (kIsComplex<T>) acc_im[q] = (acc_im[q] - im[(i + q) * n + j]) / R(2);
    }
  }
  // Row k of the planes, at k * n, holds column k of L: l(i, k) at i and
  // l(j, k) at j. (Stepped by offsets: with k * n for k < j, GCC warned of
  // overflow at iteration 2^63.)
  for (int64_t row = 0, end = j * n; row != end; row += n) {
    const R* __restrict ar = re + row + i;
    [[maybe_unused]] const R* __restrict ai = kIsComplex<T> ? im + row + i : nullptr;
    const R br = re[row + j];
    if constexpr (kIsComplex<T>) {
      const R bi = im[row + j];
      for (int q = 0; q < Q; ++q) {
        acc_re[q] -= ar[q] * br + ai[q] * bi;
        acc_im[q] -= ai[q] * br - ar[q] * bi;
      }
    } else {
      for (int q = 0; q < Q; ++q) acc_re[q] -= ar[q] * br;
    }
  }
  for (int q = 0; q < Q; ++q) {
    const R out_re = inverse == R(0) ? R(0) : acc_re[q] * inverse;
    re[j * n + i + q] = out_re;
    R& diagonal = re[(i + q) * n + i + q];
    diagonal = diagonal - out_re * out_re;
    if constexpr (kIsComplex<T>) {
      const R out_im = inverse == R(0) ? R(0) : acc_im[q] * inverse;
      im[j * n + i + q] = out_im;
      diagonal -= out_im * out_im;
    }
  }
}

// FactorPlanes and FinishPlanes on one matrix held transposed (element
// (j, i) of re and im, at j * n + i, holds A's (i, j)): each column of L is
// a contiguous row, so a column's rows are solved a vector of them at a
// time. Every element takes FactorPlanes' operations in FactorPlanes' order.
template <typename T, bool Symmetrize>
BATCHPART_SMALL_CHOLESKY_CLONES void FactorOnePlanes(int64_t n, Real<T>* __restrict re,
                                                     Real<T>* __restrict im, int32_t* info) {
  using R = Real<T>;
  constexpr int W = kLanes<T>;
  *info = 0;
  if constexpr (Symmetrize) {
    for (int64_t j = 0; j < n; ++j) re[j * n + j] = (re[j * n + j] + re[j * n + j]) / R(2);
  }
  for (int64_t j = 0; j < n; ++j) {
    const R d = re[j * n + j];
    if (*info == 0 && !(d > R(0))) *info = static_cast<int32_t>(j + 1);
    const R root = std::sqrt(d);
    re[j * n + j] = root;
    const R inverse = R(1) / root;
    if constexpr (kIsComplex<T>) im[j * n + j] = R(0);
    int64_t i = j + 1;
    for (; i + W <= n; i += W) ColumnRowsOne<T, W, Symmetrize>(n, i, j, re, im, inverse);
    for (; i < n; ++i) ColumnRowsOne<T, 1, Symmetrize>(n, i, j, re, im, inverse);
  }
  const R nan = std::numeric_limits<R>::quiet_NaN();
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t i = 0; i < n; ++i) {
      const R value_re = i < j ? R(0) : re[j * n + i];
      re[j * n + i] = *info != 0 ? nan : value_re;
      if constexpr (kIsComplex<T>) {
        const R value_im = i < j ? R(0) : im[j * n + i];
        im[j * n + i] = *info != 0 ? nan : value_im;
      }
    }
  }
}

// SolvePlanes on one system held as FactorOnePlanes leaves L (element
// (k, i) at k * n + i is l(i, k)) and X transposed (column c of X at
// c * n): every element takes SolvePlanes' operations in its order.
template <typename T>
BATCHPART_SMALL_CHOLESKY_CLONES void SolveOnePlanes(int64_t n, int64_t r,
                                                    const Real<T>* __restrict lr,
                                                    const Real<T>* __restrict li,
                                                    Real<T>* __restrict xr,
                                                    Real<T>* __restrict xi) {
  using R = Real<T>;
  for (int64_t c = 0; c < r; ++c) {
    R* __restrict yr = xr + c * n;
    [[maybe_unused]] R* __restrict yi = xi + c * n;
    for (int64_t k = 0; k < n; ++k) {
      const R inverse = R(1) / lr[k * n + k];
      const R x_re = yr[k] * inverse;
      yr[k] = x_re;
      [[maybe_unused]] R x_im = R(0);
      if constexpr (kIsComplex<T>) x_im = yi[k] = yi[k] * inverse;
      const R* __restrict a_re = lr + k * n;
      [[maybe_unused]] const R* __restrict a_im = li + k * n;
      for (int64_t i = k + 1; i < n; ++i) {
        if constexpr (kIsComplex<T>) {
          yr[i] = yr[i] - (a_re[i] * x_re - a_im[i] * x_im);
          yi[i] = yi[i] - (a_re[i] * x_im + a_im[i] * x_re);
        } else {
          yr[i] = yr[i] - a_re[i] * x_re;
        }
      }
    }
    for (int64_t k = n; k-- > 0;) {
      const R inverse = R(1) / lr[k * n + k];
      const R x_re = yr[k] * inverse;
      yr[k] = x_re;
      [[maybe_unused]] R x_im = R(0);
      if constexpr (kIsComplex<T>) x_im = yi[k] = yi[k] * inverse;
      for (int64_t i = 0; i < k; ++i) {
        const R a_re = lr[i * n + k];
        if constexpr (kIsComplex<T>) {
          const R a_im = li[i * n + k];
          yr[i] = yr[i] - (a_re * x_re + a_im * x_im);
          yi[i] = yi[i] - (a_re * x_im - a_im * x_re);
        } else {
          yr[i] = yr[i] - a_re * x_re;
        }
      }
    }
  }
}

}  // namespace

template <typename T>
void FactorLower(Group<T>& g, bool symmetrize, int32_t* info) {
  if (FactorFixedCholesky(g, symmetrize, info)) return;
  Real<T>* re = g.re(0, 0);
  Real<T>* im = kIsComplex<T> ? g.im(0, 0) : nullptr;
  for (int l = 0; l < kLanes<T>; ++l) info[l] = 0;
  if (symmetrize) {
    FactorPlanes<T, true>(g.rows(), re, im, info);
  } else {
    FactorPlanes<T, false>(g.rows(), re, im, info);
  }
  FinishPlanes<T>(g.rows(), re, im, info);
}

template <typename T, int W>
void Conjugate(Group<T, W>& g) {
  if constexpr (kIsComplex<T>) {
    Real<T>* im = g.im(0, 0);
    const int64_t count = g.rows() * g.cols() * W;
    for (int64_t e = 0; e < count; ++e) im[e] = -im[e];
  }
}

template <typename T>
void SolveLower(const Group<T>& factor, Group<T>& x) {
  if (x.rows() == 0 || x.cols() == 0) return;
  if constexpr (!kIsComplex<T>) {
    if (SolveFixedCholesky(factor, x)) return;
  }
  SolvePlanes<T>(factor.rows(), x.cols(), factor.re(0, 0),
                 kIsComplex<T> ? factor.im(0, 0) : nullptr, x.re(0, 0),
                 kIsComplex<T> ? x.im(0, 0) : nullptr);
}

template <typename T>
void FactorLowerOne(Group<T, 1>& g, bool symmetrize, int32_t* info) {
  Real<T>* re = g.re(0, 0);
  Real<T>* im = kIsComplex<T> ? g.im(0, 0) : nullptr;
  if (symmetrize) {
    FactorOnePlanes<T, true>(g.rows(), re, im, info);
  } else {
    FactorOnePlanes<T, false>(g.rows(), re, im, info);
  }
}

template <typename T>
void SolveLowerOne(const Group<T, 1>& factor, Group<T, 1>& x) {
  SolveOnePlanes<T>(factor.rows(), x.rows(), factor.re(0, 0),
                    kIsComplex<T> ? factor.im(0, 0) : nullptr, x.re(0, 0),
                    kIsComplex<T> ? x.im(0, 0) : nullptr);
}

#define BATCHPART_INSTANTIATE(T)                                 \
  template void FactorLower<T>(Group<T>&, bool, int32_t*);       \
  template void Conjugate<T, kLanes<T>>(Group<T>&);              \
  template void SolveLower<T>(const Group<T>&, Group<T>&);       \
  template void FactorLowerOne<T>(Group<T, 1>&, bool, int32_t*); \
  template void Conjugate<T, 1>(Group<T, 1>&);                   \
  template void SolveLowerOne<T>(const Group<T, 1>&, Group<T, 1>&);
BATCHPART_FOR_EACH_SCALAR(BATCHPART_INSTANTIATE)
#undef BATCHPART_INSTANTIATE

}  // namespace batchpart::lapack::interleaved
