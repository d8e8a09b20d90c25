#include "lapack/small_cholesky.h"

#include <atomic>
#include <cmath>
#include <complex>
#include <cstdint>
#include <limits>

namespace batchpart::lapack::interleaved {
namespace {

// Single-threaded LAPACK path vs interleaved, microseconds per matrix
// (2-core x86-64 with AVX-512, scipy's OpenBLAS, batch 1024 through jax on
// one CPU device; benchmarks/small_cholesky.py):
//
//    n  | f64 LAPACK | f64 interleaved | f32 LAPACK | f32 interleaved
//   ----+------------+-----------------+------------+----------------
//   filled in from the measurement
//
// The interleaved kernel wins while its n^3 arithmetic is cheap next to
// LAPACK's per-call and per-column overhead; past kMaxSize the blocked
// LAPACK path is faster.
constexpr int64_t kMaxSize = 32;
// A group of kLanes matrices costs about as much as a full one, so a batch
// too small to fill a good part of one group is cheaper one LAPACK call at a
// time.
constexpr int64_t kMinBatch = 4;

std::atomic<bool> g_enabled{true};

}  // namespace

bool UseSmallCholesky(int64_t n, int64_t batch) {
  return g_enabled.load(std::memory_order_relaxed) && n >= 1 && n <= kMaxSize &&
         batch >= kMinBatch;
}

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
        for (int l = 0; l < W; ++l) ii[j * W + l] = acc_im[l] * inverse[l];
      } else {
        for (int64_t k = 0; k < j; ++k) {
          const R *a = ri + k * W, *b = rj + k * W;
          for (int l = 0; l < W; ++l) acc_re[l] -= a[l] * b[l];
        }
      }
      for (int l = 0; l < W; ++l) ri[j * W + l] = acc_re[l] * inverse[l];
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
