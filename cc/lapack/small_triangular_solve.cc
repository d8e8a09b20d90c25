#include "lapack/small_triangular_solve.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <complex>
#include <cstdint>
#include <utility>

#include "common/batch_broadcast.h"
#include "lapack/batch_loop.h"
#include "lapack/interleaved.h"
#include "lapack/kernel_helpers.h"
#include "lapack/lapack_api.h"

namespace batchpart::lapack {
namespace {

using interleaved::Group;
using interleaved::kLanes;
using interleaved::Strides;

// The largest triangle solved by the interleaved kernel, and the smallest
// batch worth it (set from measurements, see SWITCH below).
constexpr int64_t kMaxSize = 32;
constexpr int64_t kMinBatch = 2;

std::atomic<SmallTrsmPolicy> g_policy{SmallTrsmPolicy::kAuto};

// One element of op(A)'s inverse diagonal, lane by lane: 1 / d, as OpenBLAS's
// trsm does (it stores the diagonal's reciprocals), so that each row of X
// takes multiplications instead of divisions. Complex by Smith's method, as
// OpenBLAS does too: no overflow in |d|^2 for large d.
template <typename R, int W>
[[gnu::always_inline]] inline void Reciprocal(const R* __restrict d_re, const R* __restrict d_im,
                                              bool conjugate, R* __restrict inv_re,
                                              R* __restrict inv_im) {
  if (d_im == nullptr) {
    for (int l = 0; l < W; ++l) inv_re[l] = R(1) / d_re[l];
    return;
  }
  for (int l = 0; l < W; ++l) {
    const R a = d_re[l], b = conjugate ? -d_im[l] : d_im[l];
    const bool real_larger = std::abs(a) >= std::abs(b);
    const R big = real_larger ? a : b, small = real_larger ? b : a;
    const R ratio = small / big;
    const R scale = R(1) / (big * (R(1) + ratio * ratio));
    inv_re[l] = real_larger ? scale : ratio * scale;
    inv_im[l] = real_larger ? -ratio * scale : -scale;
  }
}

// Solves M X = B in place in the interleaved p x k group x (real planes
// x_re, x_im; x_im null for real types), M the p x p group m, conj(M) with
// `kConjugate`, lower or upper triangular. Column-oriented substitution:
// once row j of X is final it updates every later row, and those updates
// are independent of each other, so with one right-hand side the FMAs
// pipeline instead of waiting on one running sum. Reads only M's triangle,
// and its diagonal only when not unit. Compiled per instruction set (the
// wheel targets baseline x86-64; AVX-512 holds one lane loop in a register).
template <typename R, bool kComplex, bool kConjugate>
#if defined(__GNUC__) && defined(__x86_64__) && defined(__linux__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
void SubstituteGroup(int64_t p, int64_t k, bool lower, bool unit_diagonal, const R* m_re,
                     const R* m_im, R* x_re, R* x_im) {
  constexpr int W = static_cast<int>(64 / sizeof(R));
  alignas(64) R inv_re[W], inv_im[W];
  for (int64_t step = 0; step < p; ++step) {
    const int64_t j = lower ? step : p - 1 - step;
    if (!unit_diagonal) {
      const int64_t d = (j * p + j) * W;
      Reciprocal<R, W>(m_re + d, kComplex ? m_im + d : nullptr, kConjugate, inv_re, inv_im);
      for (int64_t c = 0; c < k; ++c) {
        R* __restrict xr = x_re + (j * k + c) * W;
        if constexpr (kComplex) {
          R* __restrict xi = x_im + (j * k + c) * W;
          for (int l = 0; l < W; ++l) {
            const R re = xr[l] * inv_re[l] - xi[l] * inv_im[l];
            const R im = xr[l] * inv_im[l] + xi[l] * inv_re[l];
            xr[l] = re;
            xi[l] = im;
          }
        } else {
          for (int l = 0; l < W; ++l) xr[l] *= inv_re[l];
        }
      }
    }
    const int64_t i_begin = lower ? j + 1 : 0, i_end = lower ? p : j;
    for (int64_t i = i_begin; i < i_end; ++i) {
      const R* __restrict mr = m_re + (i * p + j) * W;
      for (int64_t c = 0; c < k; ++c) {
        R* __restrict yr = x_re + (i * k + c) * W;
        const R* __restrict xr = x_re + (j * k + c) * W;
        if constexpr (kComplex) {
          const R* __restrict mi = m_im + (i * p + j) * W;
          R* __restrict yi = x_im + (i * k + c) * W;
          const R* __restrict xi = x_im + (j * k + c) * W;
          for (int l = 0; l < W; ++l) {
            const R m_imag = kConjugate ? -mi[l] : mi[l];
            yr[l] -= mr[l] * xr[l] - m_imag * xi[l];
            yi[l] -= mr[l] * xi[l] + m_imag * xr[l];
          }
        } else {
          for (int l = 0; l < W; ++l) yr[l] -= mr[l] * xr[l];
        }
      }
    }
  }
}

template <typename T>
void Substitute(const Group<T>& m, Group<T>& x, bool lower, bool conjugate, bool unit_diagonal) {
  using R = Real<T>;
  const int64_t p = m.rows(), k = x.cols();
  if constexpr (kIsComplex<T>) {
    const auto solve = conjugate ? SubstituteGroup<R, true, true> : SubstituteGroup<R, true, false>;
    solve(p, k, lower, unit_diagonal, m.re(0, 0), m.im(0, 0), x.re(0, 0), x.im(0, 0));
  } else {
    SubstituteGroup<R, false, false>(p, k, lower, unit_diagonal, m.re(0, 0), nullptr, x.re(0, 0),
                                     nullptr);
  }
}

Strides Transposed(Strides s) { return {s.col_stride, s.row_stride}; }

}  // namespace

template <typename T>
bool UsesSmallTrsm(const TrsmShape& shape) {
  const SmallTrsmPolicy policy = g_policy.load();
  if (policy == SmallTrsmPolicy::kNever || shape.p == 0 || shape.rows * shape.cols == 0) {
    return false;
  }
  if (policy == SmallTrsmPolicy::kAlways) return true;
  return shape.p <= kMaxSize && Product(shape.x_batch) >= kMinBatch;
}

template <typename T>
ffi::Error SmallTrsm(ffi::ThreadPool& pool, const TrsmShape& shape, const TrsmOptions& options,
                     bool row_major, const T* a, const T* b, T* x) {
  constexpr int W = kLanes<T>;
  const int64_t p = shape.p, batch = Product(shape.x_batch);
  const int64_t a_size = p * p, x_size = shape.rows * shape.cols;
  // Every solve as a left one, M X' = B': the right side X op(A) = B is
  // op(A)^T X^T = B^T. M is op(A) (op(A)^T) up to conjugation, a transpose
  // of A exactly when transpose_a (!transpose_a); the group holds it by
  // reading A with its strides swapped, and X^T likewise, so one kernel
  // serves every side, transpose and layout.
  const bool left = options.left_side;
  const bool transpose_m = options.transpose_a == left;
  const bool lower_m = options.lower != transpose_m;
  const bool conjugate = kIsComplex<T> && options.conjugate_a;
  const int64_t k = left ? shape.cols : shape.rows;
  Strides a_strides = row_major ? interleaved::RowMajor(p) : interleaved::ColumnMajor(p);
  if (transpose_m) a_strides = Transposed(a_strides);
  Strides x_strides =
      row_major ? interleaved::RowMajor(shape.cols) : interleaved::ColumnMajor(shape.rows);
  if (!left) x_strides = Transposed(x_strides);

  const BatchBroadcast a_index(shape.x_batch, shape.a_batch);
  const BatchBroadcast b_index(shape.x_batch, shape.b_batch);
  const int64_t groups = (batch + W - 1) / W;
  const double flops = W * kFlopScale<T> * p * shape.rows * shape.cols;
  // The loop's elements are groups, so every chunk holds whole groups.
  return ForEachBatchChunk(pool, groups, flops, [&](int64_t begin, int64_t end) {
    Group<T> m(p, p), xg(p, k);
    std::array<const T*, W> a_src{}, b_src{};
    std::array<T*, W> x_dst{};
    for (int64_t g = begin; g < end; ++g) {
      const int64_t first = g * W, count = std::min<int64_t>(W, batch - first);
      for (int64_t l = 0; l < count; ++l) {
        a_src[l] = a + a_index(first + l) * a_size;
        b_src[l] = b + b_index(first + l) * x_size;
        x_dst[l] = x + (first + l) * x_size;
      }
      m.Pack(a_src.data(), count, a_strides);
      xg.Pack(b_src.data(), count, x_strides);
      Substitute(m, xg, lower_m, conjugate, options.unit_diagonal);
      xg.Unpack(x_dst.data(), count, x_strides);
    }
  });
}

void SetSmallTrsmPolicy(SmallTrsmPolicy policy) { g_policy.store(policy); }
SmallTrsmPolicy GetSmallTrsmPolicy() { return g_policy.load(); }

#define BATCHPART_SMALL_TRSM(T)                                                                 \
  template bool UsesSmallTrsm<T>(const TrsmShape&);                                             \
  template ffi::Error SmallTrsm<T>(ffi::ThreadPool&, const TrsmShape&, const TrsmOptions&, bool, \
                                   const T*, const T*, T*);
BATCHPART_SMALL_TRSM(float)
BATCHPART_SMALL_TRSM(double)
BATCHPART_SMALL_TRSM(std::complex<float>)
BATCHPART_SMALL_TRSM(std::complex<double>)
#undef BATCHPART_SMALL_TRSM

}  // namespace batchpart::lapack
