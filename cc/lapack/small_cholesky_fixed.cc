#include "lapack/small_cholesky_fixed.h"

#include <array>
#include <complex>
#include <cstdint>
#include <limits>
#include <utility>

#include "lapack/fixed_size.h"

namespace batchpart::lapack::interleaved {
namespace {

// Measured standalone on one core (a group of random positive definite
// matrices copied in and factored, 2000 times, the least of 15 runs; ns a
// matrix, FactorPlanes -> fixed size, two runs' ranges, AVX-512):
//            n = 2        4          8          12         16
//   float32    2.6 -> 1.4  4.7 -> 2.2  13 -> 9.3  28 -> 18   51 -> 34
//   float64    4.4 -> 2.7  10 -> 6.1   26 -> 23   49 -> 45   92 -> 72
//            n = 4         8          12         14         16
//   complex64  5.8 -> 4.4  19 -> 13   43 -> 33   69 -> 62   112 -> 117
//   complex128 12 -> 10.5  41 -> 33   104 -> 76  154 -> 133 244 -> 239
// (the complex rows measured beside a build; their ratios, not their
// times, carry over). A complex triangle is twice the registers, and at
// n = 16 the fixed-size factor no longer gains: complex kernels stop at 14.
// In float64 a group's square roots and divisions (one each a column, on
// the one divider) take most of what is left; a pair of groups whose steps
// interleave was no faster, so the steps are not waiting on each other.
// Packing and unpacking the group cost about as much again (8 x 8 float32:
// 5 and 6 ns a matrix).

#if BATCHPART_FIXED_SIZE

// Element (i, j), i >= j, of a lower triangle held row by row.
constexpr int Tri(int i, int j) { return i * (i + 1) / 2 + j; }

// A lower triangle as lane vectors: real parts, and imaginary parts for
// complex T.
template <typename T, int N>
struct Triangle {
  static constexpr int kSize = N * (N + 1) / 2;
  Vec<T> re[kSize];
  Vec<T> im[kIsComplex<T> ? kSize : 1];
};

// Rows J + 1.. of column J: FactorPlanes' ColumnRows (small_cholesky.cc)
// with the triangle in registers. Each row's sum runs over k in potf2's
// order, then the row's diagonal loses the square of the new element, so
// every value is FactorPlanes', bit for bit.
template <typename T, int N, int J>
BATCHPART_STEP void Column(Triangle<T, N>& l, const Vec<T>& inverse) {
  using V = Vec<T>;
#pragma GCC unroll 64
  for (int i = J + 1; i < N; ++i) {
    V acc_re = l.re[Tri(i, J)];
    [[maybe_unused]] V acc_im;
    if constexpr (kIsComplex<T>) acc_im = l.im[Tri(i, J)];
#pragma GCC unroll 64
    for (int k = 0; k < J; ++k) {
      const V ar = l.re[Tri(i, k)], br = l.re[Tri(J, k)];
      if constexpr (kIsComplex<T>) {
        const V ai = l.im[Tri(i, k)], bi = l.im[Tri(J, k)];
        acc_re -= ar * br + ai * bi;
        acc_im -= ai * br - ar * bi;
      } else {
        acc_re -= ar * br;
      }
    }
    // As the LAPACK path's scal: an infinite pivot writes zeros, where
    // inf * 0 would be NaN.
    const V out_re = inverse == V{} ? V{} : acc_re * inverse;
    l.re[Tri(i, J)] = out_re;
    V d = l.re[Tri(i, i)] - out_re * out_re;
    if constexpr (kIsComplex<T>) {
      const V out_im = inverse == V{} ? V{} : acc_im * inverse;
      l.im[Tri(i, J)] = out_im;
      d -= out_im * out_im;
    }
    l.re[Tri(i, i)] = d;
  }
}

// Column J's diagonal: a failure (not > 0, NaN included) is recorded at
// its 1-based index in the lanes without an earlier one, then the square
// root (real: a diagonal's imaginary part is not read, as in LAPACK) and
// the column below.
template <typename T, int N, int J>
BATCHPART_STEP void Step(Triangle<T, N>& l, Vec<T>& failed) {
  using R = Real<T>;
  using V = Vec<T>;
  const V d = l.re[Tri(J, J)];
  failed = ((failed == V{}) & !(d > R(0))) ? V{} + R(J + 1) : failed;
  const V s = Sqrt(d);
  l.re[Tri(J, J)] = s;
  if constexpr (kIsComplex<T>) l.im[Tri(J, J)] = V{};
  Column<T, N, J>(l, R(1) / s);
}

// Writes the factor back whole: the lower triangle, zeros above it, and
// NaN everywhere in the failed lanes (FinishPlanes in one pass).
template <typename T, int N, bool AnyFailed>
BATCHPART_STEP void Store(const Planes<T>& a, const Triangle<T, N>& l, const Vec<T>& failed) {
  using R = Real<T>;
  using V = Vec<T>;
  const V nan = V{} + std::numeric_limits<R>::quiet_NaN();
  const auto write = [&](R* at, V v) {
    if constexpr (AnyFailed) v = failed != V{} ? nan : v;
    StoreLanes(at, v);
  };
#pragma GCC unroll 64
  for (int i = 0; i < N; ++i) {
#pragma GCC unroll 64
    for (int j = 0; j < N; ++j) {
      write(a.Re(i, j), j <= i ? l.re[Tri(i, j)] : V{});
      if constexpr (kIsComplex<T>) write(a.Im(i, j), j <= i ? l.im[Tri(i, j)] : V{});
    }
  }
}

// FactorPlanes and FinishPlanes (small_cholesky.cc) for one size.
template <typename T, int N, bool Symmetrize, int... J>
BATCHPART_AVX512 void FactorSteps(Real<T>* re, Real<T>* im, int32_t* info,
                                  std::integer_sequence<int, J...>) {
  using R = Real<T>;
  using V = Vec<T>;
  const Planes<T> a{re, im, N};
  Triangle<T, N> l;
#pragma GCC unroll 64
  for (int i = 0; i < N; ++i) {
#pragma GCC unroll 64
    for (int j = 0; j <= i; ++j) {
      l.re[Tri(i, j)] = LoadLanes(a.Re(i, j));
      if constexpr (kIsComplex<T>) l.im[Tri(i, j)] = LoadLanes(a.Im(i, j));
      // (A + A^H) / 2's lower triangle, as SymmetrizeTriangle computes it.
      if constexpr (Symmetrize) {
        l.re[Tri(i, j)] = Rounded((l.re[Tri(i, j)] + LoadLanes(a.Re(j, i))) / R(2));
        if constexpr (kIsComplex<T>) {
          l.im[Tri(i, j)] = Rounded((l.im[Tri(i, j)] - LoadLanes(a.Im(j, i))) / R(2));
        }
      }
    }
  }
  V failed{};  // info as lane values
  (Step<T, N, J>(l, failed), ...);
  if (Any(failed != V{})) {
    Store<T, N, true>(a, l, failed);
  } else {
    Store<T, N, false>(a, l, failed);
  }
  StoreLaneInts<T>(failed, info);
}

template <typename T, int N, bool Symmetrize>
void Factor(Real<T>* re, Real<T>* im, int32_t* info) {
  FactorSteps<T, N, Symmetrize>(re, im, info, std::make_integer_sequence<int, N>{});
}

// SolvePlanes (small_cholesky.cc) for one size: L Y = B, then L^H X = Y,
// one column of B at a time with the column in registers. The same
// operations in the same order, so the same bits.
template <typename T, int N>
BATCHPART_AVX512 void Solve(const Real<T>* l_re, Real<T>* x_re, int64_t r) {
  using R = Real<T>;
  using V = Vec<T>;
  const Planes<T> l{const_cast<R*>(l_re), nullptr, N};
  const Planes<T> x{x_re, nullptr, r};
  V inverse[N];
#pragma GCC unroll 64
  for (int k = 0; k < N; ++k) inverse[k] = R(1) / LoadLanes(l.Re(k, k));
#pragma GCC unroll 1
  for (int64_t c = 0; c < r; ++c) {
    V v[N];
    LoadColumn<T, N>(x, c, v);
#pragma GCC unroll 64
    for (int k = 0; k < N; ++k) {
      v[k] = v[k] * inverse[k];
#pragma GCC unroll 64
      for (int i = k + 1; i < N; ++i) v[i] = v[i] - LoadLanes(l.Re(i, k)) * v[k];
    }
#pragma GCC unroll 64
    for (int k = N - 1; k >= 0; --k) {
      v[k] = v[k] * inverse[k];
#pragma GCC unroll 64
      for (int i = 0; i < k; ++i) v[i] = v[i] - LoadLanes(l.Re(k, i)) * v[k];
    }
    StoreColumn<T, N>(x, c, v);
  }
}

// The kernels for n = 1 .. kMaxFixedCholesky<T>, by n - 1.
template <typename T, bool Symmetrize, int... M>
constexpr auto Factors(std::integer_sequence<int, M...>) {
  return std::array<void (*)(Real<T>*, Real<T>*, int32_t*), sizeof...(M)>{
      &Factor<T, M + 1, Symmetrize>...};
}
template <typename T, int... M>
constexpr auto Solves(std::integer_sequence<int, M...>) {
  return std::array<void (*)(const Real<T>*, Real<T>*, int64_t), sizeof...(M)>{
      &Solve<T, M + 1>...};
}

template <typename T, bool Symmetrize>
inline constexpr auto kFactors =
    Factors<T, Symmetrize>(std::make_integer_sequence<int, kMaxFixedCholesky<T>>{});
template <typename T>
inline constexpr auto kSolves = Solves<T>(std::make_integer_sequence<int, kMaxFixedCholesky<T>>{});

#endif  // BATCHPART_FIXED_SIZE

}  // namespace

template <typename T>
bool FactorFixedCholesky(Group<T>& g, bool symmetrize, int32_t* info) {
#if BATCHPART_FIXED_SIZE
  const int64_t n = g.rows();
  if (!HasFixedSizeKernel(n, g.cols(), kMaxFixedCholesky<T>)) return false;
  (symmetrize ? kFactors<T, true> : kFactors<T, false>)[n - 1](
      g.re(0, 0), kIsComplex<T> ? g.im(0, 0) : nullptr, info);
  return true;
#else
  return false;
#endif
}

template <typename T>
bool SolveFixedCholesky(const Group<T>& factor, Group<T>& x) {
#if BATCHPART_FIXED_SIZE
  const int64_t n = factor.rows();
  if (!HasFixedSizeKernel(n, factor.cols(), kMaxFixedCholesky<T>)) return false;
  kSolves<T>[n - 1](factor.re(0, 0), x.re(0, 0), x.cols());
  return true;
#else
  return false;
#endif
}

template bool FactorFixedCholesky<float>(Group<float>&, bool, int32_t*);
template bool FactorFixedCholesky<double>(Group<double>&, bool, int32_t*);
template bool FactorFixedCholesky<std::complex<float>>(Group<std::complex<float>>&, bool,
                                                       int32_t*);
template bool FactorFixedCholesky<std::complex<double>>(Group<std::complex<double>>&, bool,
                                                        int32_t*);
template bool SolveFixedCholesky<float>(const Group<float>&, Group<float>&);
template bool SolveFixedCholesky<double>(const Group<double>&, Group<double>&);

}  // namespace batchpart::lapack::interleaved
