#include "lapack/small_cholesky.h"

#include <atomic>
#include <cmath>
#include <complex>
#include <cstdint>
#include <limits>

namespace batchpart::lapack::interleaved {
namespace {

// The cut-offs, measured single-threaded through jax on one CPU device
// (benchmarks/small_cholesky.py switch [--posv]: 1024 matrices, 2 shared
// x86-64 cores with AVX-512, scipy 1.17's OpenBLAS; microseconds per matrix,
// the least of 9 runs, LAPACK path / interleaved):
//
//    n  | potrf f64   | potrf f32   | posv f64, 1 rhs | posv f32, 1 rhs
//   ----+-------------+-------------+-----------------+----------------
//    2  | 0.073 0.015 | 0.062 0.013 |   0.166 0.024   |   0.166 0.018
//    4  | 0.130 0.037 | 0.117 0.023 |   0.254 0.053   |   0.245 0.031
//    8  | 0.229 0.079 | 0.285 0.114 |   0.453 0.127   |   0.418 0.057
//   16  | 0.857 0.517 | 0.534 0.251 |   1.329 0.627   |   0.933 0.387
//   24  | 1.515 1.255 | 0.951 0.608 |   1.954 0.705   |   1.558 0.509
//   28  | 2.111 1.985 | 1.346 0.915 |   2.737 0.943   |   2.327 0.826
//   32  | 2.755 3.479 | 1.760 3.358 |   5.089 2.937   |   2.899 1.672
//   40  | 7.815 4.606 | 4.084 3.350 |   7.285 5.328   |   5.847 2.702
//   48  | 9.243 14.63 | 5.298 5.727 |   11.96 5.233   |   11.33 4.916
//   56  | 12.25 11.00 | 7.209 7.436 |   18.44 9.147   |   10.22 9.023
//   64  | 11.67 20.06 | 8.349 17.77 |   18.09 20.16   |   10.16 11.97
//
// potrf's interleaved time jumps at n = 32, where unpacking writes lanes
// 4 or 8 KiB apart (the same cache sets) and the factor is written back
// whole. posv writes back only x and stays ahead up to 48, but it stops at
// 32: up to there OpenBLAS's potrf runs its unblocked potf2, the algorithm
// this kernel mirrors, so even a matrix with infinite entries gets the same
// info on both paths; above it the blocked potrf meets them in another order
// (an all-inf 48 x 48 matrix fails there at pivot 13, here not at all).
constexpr int64_t kMaxFactorSize = 28;
constexpr int64_t kMaxSolveSize = 32;
// A group of kLanes matrices costs about as much as a full one; through jax
// (7-8 us per call) batches of 4 came out even and 6 or more faster
// interleaved (benchmarks/small_cholesky.py batch).
constexpr int64_t kMinBatch = 4;

std::atomic<bool> g_enabled{true};

}  // namespace

bool UseSmallCholesky(int64_t n, int64_t batch) {
  return g_enabled.load(std::memory_order_relaxed) && n >= 1 && n <= kMaxFactorSize &&
         batch >= kMinBatch;
}

bool UseSmallPosv(int64_t n, int64_t batch) {
  return g_enabled.load(std::memory_order_relaxed) && n >= 1 && n <= kMaxSolveSize &&
         batch >= kMinBatch;
}

int64_t SmallCholeskyMaxSize() { return kMaxFactorSize; }
int64_t SmallPosvMaxSize() { return kMaxSolveSize; }
int64_t SmallCholeskyMinBatch() { return kMinBatch; }

void SetSmallCholesky(bool enabled) { g_enabled.store(enabled); }
bool SmallCholesky() { return g_enabled.load(); }

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

// Left-looking Cholesky of the lower triangle of n x n lanes, element (i, j)
// at (i * n + j) * W of `re` (and `im`, complex only); info as FactorLower.
template <typename T>
BATCHPART_SMALL_CHOLESKY_CLONES void FactorPlanes(int64_t n, Real<T>* __restrict re,
                                                  Real<T>* __restrict im, int32_t* info) {
  using R = Real<T>;
  constexpr int W = kLanes<T>;
  for (int64_t j = 0; j < n; ++j) {
    R* rj = re + j * n * W;
    [[maybe_unused]] R* ij = im + j * n * W;
    // The diagonal: a(j, j) - sum_k |l(j, k)|^2 (the imaginary part of a
    // complex diagonal is not read, as in LAPACK).
    R d[W];
    for (int l = 0; l < W; ++l) d[l] = rj[j * W + l];
    for (int64_t k = 0; k < j; ++k) {
      const R* x = rj + k * W;
      for (int l = 0; l < W; ++l) d[l] -= x[l] * x[l];
      if constexpr (kIsComplex<T>) {
        const R* y = ij + k * W;
        for (int l = 0; l < W; ++l) d[l] -= y[l] * y[l];
      }
    }
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
    // The column below: (a(i, j) - sum_k l(i, k) conj(l(j, k))) / l(j, j).
    for (int64_t i = j + 1; i < n; ++i) {
      R* ri = re + i * n * W;
      R acc_re[W];
      for (int l = 0; l < W; ++l) acc_re[l] = ri[j * W + l];
      if constexpr (kIsComplex<T>) {
        R* ii = im + i * n * W;
        R acc_im[W];
        for (int l = 0; l < W; ++l) acc_im[l] = ii[j * W + l];
        for (int64_t k = 0; k < j; ++k) {
          const R *ar = ri + k * W, *ai = ii + k * W, *br = rj + k * W, *bi = ij + k * W;
          for (int l = 0; l < W; ++l) {
            acc_re[l] -= ar[l] * br[l] + ai[l] * bi[l];
            acc_im[l] -= ai[l] * br[l] - ar[l] * bi[l];
          }
        }
        for (int l = 0; l < W; ++l) {
          ii[j * W + l] = inverse[l] == R(0) ? R(0) : acc_im[l] * inverse[l];
        }
      } else {
        for (int64_t k = 0; k < j; ++k) {
          const R *a = ri + k * W, *b = rj + k * W;
          for (int l = 0; l < W; ++l) acc_re[l] -= a[l] * b[l];
        }
      }
      // As the LAPACK path's scal (OpenBLAS): a zero scale (an infinite
      // pivot) writes zeros, where inf * 0 would be NaN.
      for (int l = 0; l < W; ++l) {
        ri[j * W + l] = inverse[l] == R(0) ? R(0) : acc_re[l] * inverse[l];
      }
    }
  }
}

// Forward then back substitution L Y = B, L^H X = Y on n x r lanes of `x`
// (element (i, c) at (i * r + c) * W), L as FactorPlanes leaves it.
template <typename T>
BATCHPART_SMALL_CHOLESKY_CLONES void SolvePlanes(int64_t n, int64_t r, const Real<T>* __restrict lr,
                                                 const Real<T>* __restrict li,
                                                 Real<T>* __restrict xr, Real<T>* __restrict xi) {
  using R = Real<T>;
  constexpr int W = kLanes<T>;
  R inverse[W];
  for (int64_t i = 0; i < n; ++i) {
    for (int l = 0; l < W; ++l) inverse[l] = R(1) / lr[(i * n + i) * W + l];
    for (int64_t c = 0; c < r; ++c) {
      R acc_re[W];
      R* out_re = xr + (i * r + c) * W;
      for (int l = 0; l < W; ++l) acc_re[l] = out_re[l];
      if constexpr (kIsComplex<T>) {
        R acc_im[W];
        R* out_im = xi + (i * r + c) * W;
        for (int l = 0; l < W; ++l) acc_im[l] = out_im[l];
        for (int64_t k = 0; k < i; ++k) {
          const R *ar = lr + (i * n + k) * W, *ai = li + (i * n + k) * W;
          const R *br = xr + (k * r + c) * W, *bi = xi + (k * r + c) * W;
          for (int l = 0; l < W; ++l) {
            acc_re[l] -= ar[l] * br[l] - ai[l] * bi[l];
            acc_im[l] -= ar[l] * bi[l] + ai[l] * br[l];
          }
        }
        for (int l = 0; l < W; ++l) out_im[l] = acc_im[l] * inverse[l];
      } else {
        for (int64_t k = 0; k < i; ++k) {
          const R *a = lr + (i * n + k) * W, *b = xr + (k * r + c) * W;
          for (int l = 0; l < W; ++l) acc_re[l] -= a[l] * b[l];
        }
      }
      for (int l = 0; l < W; ++l) out_re[l] = acc_re[l] * inverse[l];
    }
  }
  for (int64_t i = n; i-- > 0;) {
    for (int l = 0; l < W; ++l) inverse[l] = R(1) / lr[(i * n + i) * W + l];
    for (int64_t c = 0; c < r; ++c) {
      R acc_re[W];
      R* out_re = xr + (i * r + c) * W;
      for (int l = 0; l < W; ++l) acc_re[l] = out_re[l];
      if constexpr (kIsComplex<T>) {
        R acc_im[W];
        R* out_im = xi + (i * r + c) * W;
        for (int l = 0; l < W; ++l) acc_im[l] = out_im[l];
        // conj(l(k, i)) x(k, c)
        for (int64_t k = i + 1; k < n; ++k) {
          const R *ar = lr + (k * n + i) * W, *ai = li + (k * n + i) * W;
          const R *br = xr + (k * r + c) * W, *bi = xi + (k * r + c) * W;
          for (int l = 0; l < W; ++l) {
            acc_re[l] -= ar[l] * br[l] + ai[l] * bi[l];
            acc_im[l] -= ar[l] * bi[l] - ai[l] * br[l];
          }
        }
        for (int l = 0; l < W; ++l) out_im[l] = acc_im[l] * inverse[l];
      } else {
        for (int64_t k = i + 1; k < n; ++k) {
          const R *a = lr + (k * n + i) * W, *b = xr + (k * r + c) * W;
          for (int l = 0; l < W; ++l) acc_re[l] -= a[l] * b[l];
        }
      }
      for (int l = 0; l < W; ++l) out_re[l] = acc_re[l] * inverse[l];
    }
  }
}

// The lower triangle of (A + A^H) / 2, computed as SymmetrizeTriangle
// (kernel_helpers.h) does, so both paths factor the same numbers.
template <typename T>
void SymmetrizeLower(Group<T>& g) {
  using R = Real<T>;
  constexpr int W = kLanes<T>;
  const int64_t n = g.rows();
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j <= i; ++j) {
      R* x = g.re(i, j);
      const R* y = g.re(j, i);
      for (int l = 0; l < W; ++l) x[l] = (x[l] + y[l]) / R(2);
      if constexpr (kIsComplex<T>) {
        R* xi = g.im(i, j);
        const R* yi = g.im(j, i);
        for (int l = 0; l < W; ++l) xi[l] = (xi[l] - yi[l]) / R(2);
      }
    }
  }
}

}  // namespace

template <typename T>
void FactorLower(Group<T>& g, bool symmetrize, int32_t* info) {
  using R = Real<T>;
  constexpr int W = kLanes<T>;
  const int64_t n = g.rows();
  if (symmetrize) SymmetrizeLower(g);
  for (int l = 0; l < W; ++l) info[l] = 0;
  FactorPlanes<T>(n, g.re(0, 0), kIsComplex<T> ? g.im(0, 0) : nullptr, info);
  bool failed = false;
  for (int l = 0; l < W; ++l) failed |= info[l] != 0;
  const R nan = std::numeric_limits<R>::quiet_NaN();
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      R* x = g.re(i, j);
      [[maybe_unused]] R* y = kIsComplex<T> ? g.im(i, j) : nullptr;
      if (j > i) {
        for (int l = 0; l < W; ++l) x[l] = R(0);
        if constexpr (kIsComplex<T>) {
          for (int l = 0; l < W; ++l) y[l] = R(0);
        }
      }
      if (!failed) continue;
      for (int l = 0; l < W; ++l) {
        if (info[l] == 0) continue;
        x[l] = nan;
        if constexpr (kIsComplex<T>) y[l] = nan;
      }
    }
  }
}

template <typename T>
void Conjugate(Group<T>& g) {
  if constexpr (kIsComplex<T>) {
    Real<T>* im = g.im(0, 0);
    const int64_t count = g.rows() * g.cols() * kLanes<T>;
    for (int64_t e = 0; e < count; ++e) im[e] = -im[e];
  }
}

template <typename T>
void SolveLower(const Group<T>& factor, Group<T>& x) {
  if (x.rows() == 0 || x.cols() == 0) return;
  SolvePlanes<T>(factor.rows(), x.cols(), factor.re(0, 0),
                 kIsComplex<T> ? factor.im(0, 0) : nullptr, x.re(0, 0),
                 kIsComplex<T> ? x.im(0, 0) : nullptr);
}

#define BATCHPART_INSTANTIATE(T)                                \
  template void FactorLower<T>(Group<T>&, bool, int32_t*);      \
  template void Conjugate<T>(Group<T>&);                        \
  template void SolveLower<T>(const Group<T>&, Group<T>&);
BATCHPART_INSTANTIATE(float)
BATCHPART_INSTANTIATE(double)
BATCHPART_INSTANTIATE(std::complex<float>)
BATCHPART_INSTANTIATE(std::complex<double>)
#undef BATCHPART_INSTANTIATE

}  // namespace batchpart::lapack::interleaved
