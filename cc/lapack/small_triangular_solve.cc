#include "lapack/small_triangular_solve.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <complex>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "common/batch_broadcast.h"
#include "lapack/batch_loop.h"
#include "lapack/group_loop.h"
#include "lapack/interleaved.h"
#include "lapack/kernel_helpers.h"
#include "lapack/lapack_api.h"
#include "lapack/scalar_types.h"

namespace batchpart::lapack {
namespace {

using interleaved::Group;
using interleaved::kLanes;
using interleaved::Strides;
using interleaved::Transposed;

// The largest triangle solved by the interleaved kernel. Measured single-
// threaded on one CPU device (benchmarks/small_trsm.py: 1024 left, lower
// solves through jax, us per batch, BLAS-or-row-substitution path vs this
// kernel; AVX-512, 2 shared cores, so +-20% noise):
//   n             12         16         24          32
//   f32, 1 rhs        -     348 / 42   270 / 135   427 / 236
//   f32, 4 rhs        -     368 / 74   489 / 185   738 / 329
//   f64, 1 rhs        -     290 / 95   461 / 258   755 / 458
//   f64, 4 rhs        -     381 / 159  571 / 366   936 / 614
//   c64, 1 rhs        -     339 / 176  621 / 438  1012 / 674
//   c64, 4 rhs        -     478 / 284  904 / 651  1418 / 1015
//   c128, 1 rhs   253 / 236 403 / 490  673 / 1153 1138 / 1816
//   c128, 4 rhs   373 / 333 531 / 608  934 / 1252 1492 / 1885
// The real types and complex64 win at every n measured (to 64: 1.3-2.6x
// from 24 on), complex128 only up to 12. The kernel stops at 32, the sizes
// it was written for.
template <typename T>
constexpr int64_t kMaxSize = std::is_same_v<T, std::complex<double>> ? 12 : 32;
// A group of fewer systems solves them one by one (SubstituteGroup with
// W = 1): below half a group the padding lanes' work and the packing
// outweighed one call per matrix (n = 16 and 24: a group was 8-19% slower
// for a single matrix, faster from 8 f32 or 4 f64 matrices on).
template <typename T>
constexpr int64_t kMinGroup = kLanes<T> / 2;

// The reciprocals of one diagonal element of M across the lanes: 1 / d, as
// OpenBLAS's trsm does (it stores the diagonal's reciprocals), so that a
// row of X takes multiplications instead of divisions. Complex by Smith's
// method, as OpenBLAS does too: no overflow in |d|^2 for large d.
template <typename R, int W, bool kComplex, bool kConjugate>
[[gnu::always_inline]] inline void Reciprocal(const R* __restrict d_re, const R* __restrict d_im,
                                              R* __restrict inv_re, R* __restrict inv_im) {
  if constexpr (!kComplex) {
    for (int l = 0; l < W; ++l) inv_re[l] = R(1) / d_re[l];
  } else {
    constexpr R kSign = kConjugate ? R(-1) : R(1);
    for (int l = 0; l < W; ++l) {
      const R a = d_re[l], b = kSign * d_im[l];
      const bool real_larger = std::abs(a) >= std::abs(b);
      const R big = real_larger ? a : b, small = real_larger ? b : a;
      const R ratio = small / big;
      const R scale = R(1) / (big * (R(1) + ratio * ratio));
      inv_re[l] = real_larger ? scale : ratio * scale;
      inv_im[l] = real_larger ? -ratio * scale : -scale;
    }
  }
}

// Right-hand sides solved together: each has its own running sum, so with
// several the multiply-adds of one row overlap instead of waiting on one
// sum's latency, and the sums still fit in registers.
constexpr int kRhsBlock = 4;

// Row i of X, columns [c0, c0 + NB), by row-oriented substitution: the
// sums over the rows j already solved are kept in local arrays (registers)
// and stored once, so the loops over the lanes have no stores that could
// alias their loads and vectorize without runtime checks.
template <typename R, int W, int NB, bool kComplex, bool kConjugate>
[[gnu::always_inline]] inline void SolveRowBlock(int64_t p, int64_t k, int64_t i, int64_t c0,
                                                 int64_t j_begin, int64_t j_end, bool scale,
                                                 const R* m_re, const R* m_im, const R* inv_re,
                                                 const R* inv_im, R* x_re, R* x_im) {
  constexpr R kSign = kConjugate ? R(-1) : R(1);
  R sum_re[NB][W], sum_im[NB][W];
  for (int c = 0; c < NB; ++c) {
    for (int l = 0; l < W; ++l) sum_re[c][l] = x_re[(i * k + c0 + c) * W + l];
    if constexpr (kComplex) {
      for (int l = 0; l < W; ++l) sum_im[c][l] = x_im[(i * k + c0 + c) * W + l];
    }
  }
  for (int64_t j = j_begin; j < j_end; ++j) {
    const R* __restrict mr = m_re + (i * p + j) * W;
    [[maybe_unused]] const R* __restrict mi = kComplex ? m_im + (i * p + j) * W : nullptr;
    for (int c = 0; c < NB; ++c) {
      const R* __restrict xr = x_re + (j * k + c0 + c) * W;
      if constexpr (kComplex) {
        const R* __restrict xi = x_im + (j * k + c0 + c) * W;
        for (int l = 0; l < W; ++l) {
          const R m_imag = kSign * mi[l];
          sum_re[c][l] -= mr[l] * xr[l] - m_imag * xi[l];
          sum_im[c][l] -= mr[l] * xi[l] + m_imag * xr[l];
        }
      } else {
        for (int l = 0; l < W; ++l) sum_re[c][l] -= mr[l] * xr[l];
      }
    }
  }
  for (int c = 0; c < NB; ++c) {
    R* __restrict yr = x_re + (i * k + c0 + c) * W;
    if constexpr (kComplex) {
      R* __restrict yi = x_im + (i * k + c0 + c) * W;
      for (int l = 0; l < W; ++l) {
        const R re = sum_re[c][l], im = sum_im[c][l];
        yr[l] = scale ? re * inv_re[l] - im * inv_im[l] : re;
        yi[l] = scale ? re * inv_im[l] + im * inv_re[l] : im;
      }
    } else {
      for (int l = 0; l < W; ++l) yr[l] = scale ? sum_re[c][l] * inv_re[l] : sum_re[c][l];
    }
  }
}

// Solves M X = B in place in the interleaved p x k group x of W lanes
// (real planes x_re, x_im; x_im null for real types), M the p x p group m,
// conj(M) with `kConjugate`, lower or upper triangular: forward or back
// substitution, a row of X at a time. Reads only M's triangle, and its
// diagonal only when not unit. W = 1 solves one matrix with each lane's
// arithmetic. Compiled per instruction set (the wheel targets baseline
// x86-64; AVX-512 holds one lane loop in a register).
template <typename R, int W, bool kComplex, bool kConjugate>
#if defined(__GNUC__) && defined(__x86_64__) && defined(__linux__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
void SubstituteGroup(int64_t p, int64_t k, bool lower, bool unit_diagonal, const R* m_re,
                     const R* m_im, R* x_re, R* x_im) {
  alignas(64) R inv_re[W], inv_im[W];
  for (int64_t step = 0; step < p; ++step) {
    const int64_t i = lower ? step : p - 1 - step;
    const int64_t j_begin = lower ? 0 : i + 1, j_end = lower ? i : p;
    if (!unit_diagonal) {
      const int64_t d = (i * p + i) * W;
      Reciprocal<R, W, kComplex, kConjugate>(m_re + d, kComplex ? m_im + d : nullptr, inv_re,
                                             inv_im);
    }
    const bool scale = !unit_diagonal;
    int64_t c0 = 0;
    for (; c0 + kRhsBlock <= k; c0 += kRhsBlock) {
      SolveRowBlock<R, W, kRhsBlock, kComplex, kConjugate>(p, k, i, c0, j_begin, j_end, scale,
                                                           m_re, m_im, inv_re, inv_im, x_re, x_im);
    }
    switch (k - c0) {
      case 1:
        SolveRowBlock<R, W, 1, kComplex, kConjugate>(p, k, i, c0, j_begin, j_end, scale, m_re,
                                                     m_im, inv_re, inv_im, x_re, x_im);
        break;
      case 2:
        SolveRowBlock<R, W, 2, kComplex, kConjugate>(p, k, i, c0, j_begin, j_end, scale, m_re,
                                                     m_im, inv_re, inv_im, x_re, x_im);
        break;
      case 3:
        SolveRowBlock<R, W, 3, kComplex, kConjugate>(p, k, i, c0, j_begin, j_end, scale, m_re,
                                                     m_im, inv_re, inv_im, x_re, x_im);
        break;
      default:
        break;
    }
  }
}

template <typename T, int W>
void Substitute(const Group<T, W>& m, Group<T, W>& x, bool lower, bool conjugate,
                bool unit_diagonal) {
  using R = Real<T>;
  const int64_t p = m.rows(), k = x.cols();
  if constexpr (kIsComplex<T>) {
    const auto solve =
        conjugate ? SubstituteGroup<R, W, true, true> : SubstituteGroup<R, W, true, false>;
    solve(p, k, lower, unit_diagonal, m.re(0, 0), m.im(0, 0), x.re(0, 0), x.im(0, 0));
  } else {
    SubstituteGroup<R, W, false, false>(p, k, lower, unit_diagonal, m.re(0, 0), nullptr, x.re(0, 0),
                                        nullptr);
  }
}

// Every solve as a left one, M X' = B': the right side X op(A) = B is
// op(A)^T X^T = B^T. M is op(A) (op(A)^T) up to conjugation, a transpose of
// A exactly when transpose_a (!transpose_a); a group holds it by reading A
// with its strides swapped, and X^T likewise, so one kernel serves every
// side, transpose and layout.
struct LeftSystem {
  LeftSystem(const TrsmShape& shape, const TrsmOptions& options, bool row_major, bool complex)
      : k(options.left_side ? shape.cols : shape.rows),
        lower(options.lower != (options.transpose_a == options.left_side)),
        conjugate(complex && options.conjugate_a),
        unit_diagonal(options.unit_diagonal) {
    const bool left = options.left_side;
    a = row_major ? interleaved::RowMajor(shape.p) : interleaved::ColumnMajor(shape.p);
    if (options.transpose_a == left) a = Transposed(a);
    x = row_major ? interleaved::RowMajor(shape.cols) : interleaved::ColumnMajor(shape.rows);
    if (!left) x = Transposed(x);
  }
  int64_t k;       // columns of X'
  bool lower;      // M's triangle
  bool conjugate;  // M is conj of what A's strides read
  bool unit_diagonal;
  Strides a, x;  // how M and X' are read from A and X
};

// M (p x p) and X' (p x k) of W matrices: a group, or one matrix (W = 1).
template <typename T, int W>
struct SystemPlanes {
  SystemPlanes(int64_t p, int64_t k) : m(p, p), x(p, k) {}
  Group<T, W> m, x;
};

}  // namespace

template <typename T>
bool UsesSmallTrsm(const TrsmShape& shape) {
  if (shape.p == 0 || shape.rows * shape.cols == 0) return false;
  return interleaved::UseSmallPath(interleaved::SmallKernel::kTriangularSolve,
                                   shape.p <= kMaxSize<T>);
}

template <typename T>
ffi::Error SmallTrsm(ffi::ThreadPool& pool, const TrsmShape& shape, const TrsmOptions& options,
                     bool row_major, const T* a, const T* b, T* x) {
  constexpr int W = kLanes<T>;
  const int64_t p = shape.p, batch = Product(shape.x_batch);
  const int64_t a_size = p * p, x_size = shape.rows * shape.cols;
  const LeftSystem system(shape, options, row_major, kIsComplex<T>);
  const BatchBroadcast a_index(shape.x_batch, shape.a_batch);
  const BatchBroadcast b_index(shape.x_batch, shape.b_batch);
  // A group's systems (SystemPlanes<T, W>) or one system (W = 1), alike.
  const auto solve = [&](auto& s, interleaved::Lanes lanes) {
    interleaved::PackTriangleLanes(s.m, a, a_index, a_size, lanes, system.a, system.lower);
    interleaved::PackLanes(s.x, b, b_index, x_size, lanes, system.x);
    Substitute(s.m, s.x, system.lower, system.conjugate, system.unit_diagonal);
    interleaved::UnpackLanes(s.x, x, x_size, lanes, system.x);
  };
  return interleaved::ForEachGroupOrOne<T>(
      pool, batch, kFlopScale<T> * p * shape.rows * shape.cols, kMinGroup<T>,
      [&] { return SystemPlanes<T, W>(p, system.k); }, solve,
      [&] { return SystemPlanes<T, 1>(p, system.k); }, solve);
}

template <typename T>
int64_t SmallTrsmMaxSize() {
  return kMaxSize<T>;
}

#define BATCHPART_SMALL_TRSM(T)                                                                 \
  template bool UsesSmallTrsm<T>(const TrsmShape&);                                             \
  template int64_t SmallTrsmMaxSize<T>();                                                       \
  template ffi::Error SmallTrsm<T>(ffi::ThreadPool&, const TrsmShape&, const TrsmOptions&, bool, \
                                   const T*, const T*, T*);
BATCHPART_FOR_EACH_SCALAR(BATCHPART_SMALL_TRSM)
#undef BATCHPART_SMALL_TRSM

}  // namespace batchpart::lapack
