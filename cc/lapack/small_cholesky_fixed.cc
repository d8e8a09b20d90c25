#include "lapack/small_cholesky_fixed.h"

#include <array>
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
// In float64 a group's square roots and divisions (one each a column, on
// the one divider) take most of what is left; a pair of groups whose steps
// interleave was no faster, so the steps are not waiting on each other.
// Packing and unpacking the group cost about as much again (8 x 8 float32:
// 5 and 6 ns a matrix).

#if BATCHPART_FIXED_SIZE

// Element (i, j), i >= j, of a lower triangle held row by row.
constexpr int Tri(int i, int j) { return i * (i + 1) / 2 + j; }

// Rows j + 1.. of column j: FactorPlanes' ColumnRows (small_cholesky.cc)
// with the triangle in registers. Each row's sum runs over k in potf2's
// order, then the row's diagonal loses the square of the new element, so
// every value is FactorPlanes', bit for bit.
template <typename T, int N, int J>
BATCHPART_STEP void Column(Vec<T> (&l)[N * (N + 1) / 2], const Vec<T>& inverse) {
  using V = Vec<T>;
#pragma GCC unroll 64
  for (int i = J + 1; i < N; ++i) {
    V acc = l[Tri(i, J)];
#pragma GCC unroll 64
    for (int k = 0; k < J; ++k) acc -= l[Tri(i, k)] * l[Tri(J, k)];
    // As the LAPACK path's scal: an infinite pivot writes zeros, where
    // inf * 0 would be NaN.
    const V out = inverse == V{} ? V{} : acc * inverse;
    l[Tri(i, J)] = out;
    l[Tri(i, i)] = l[Tri(i, i)] - out * out;
  }
}

// Column J's diagonal: a failure (not > 0, NaN included) is recorded at
// its 1-based index in the lanes without an earlier one, then the square
// root and the column below.
template <typename T, int N, int J>
BATCHPART_STEP void Step(Vec<T> (&l)[N * (N + 1) / 2], Vec<T>& failed) {
  using R = Real<T>;
  using V = Vec<T>;
  const V d = l[Tri(J, J)];
  failed = ((failed == V{}) & !(d > R(0))) ? V{} + R(J + 1) : failed;
  const V s = Sqrt(d);
  l[Tri(J, J)] = s;
  Column<T, N, J>(l, R(1) / s);
}

// Writes the factor back whole: the lower triangle, zeros above it, and
// NaN everywhere in the failed lanes (FinishPlanes in one pass).
template <typename T, int N, bool AnyFailed>
BATCHPART_STEP void Store(const Planes<T>& a, const Vec<T> (&l)[N * (N + 1) / 2],
                          const Vec<T>& failed) {
  using R = Real<T>;
  using V = Vec<T>;
  const V nan = V{} + std::numeric_limits<R>::quiet_NaN();
#pragma GCC unroll 64
  for (int i = 0; i < N; ++i) {
#pragma GCC unroll 64
    for (int j = 0; j < N; ++j) {
      V v = j <= i ? l[Tri(i, j)] : V{};
      if constexpr (AnyFailed) v = failed != V{} ? nan : v;
      StoreLanes(a.Re(i, j), v);
    }
  }
}

// FactorPlanes and FinishPlanes (small_cholesky.cc) for one size.
template <typename T, int N, bool Symmetrize, int... J>
BATCHPART_AVX512 void FactorSteps(Real<T>* re, int32_t* info, std::integer_sequence<int, J...>) {
  using R = Real<T>;
  using V = Vec<T>;
  const Planes<T> a{re, nullptr, N};
  V l[N * (N + 1) / 2];
#pragma GCC unroll 64
  for (int i = 0; i < N; ++i) {
#pragma GCC unroll 64
    for (int j = 0; j <= i; ++j) {
      l[Tri(i, j)] = LoadLanes(a.Re(i, j));
      // (A + A^H) / 2's lower triangle, as SymmetrizeTriangle computes it.
      if constexpr (Symmetrize) {
        l[Tri(i, j)] = Rounded((l[Tri(i, j)] + LoadLanes(a.Re(j, i))) / R(2));
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
void Factor(Real<T>* re, int32_t* info) {
  FactorSteps<T, N, Symmetrize>(re, info, std::make_integer_sequence<int, N>{});
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
#pragma GCC unroll 64
    for (int i = 0; i < N; ++i) v[i] = LoadLanes(x.Re(i, c));
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
#pragma GCC unroll 64
    for (int i = 0; i < N; ++i) StoreLanes(x.Re(i, c), v[i]);
  }
}

// The kernels for n = 1 .. kMaxFixedCholesky, by n - 1.
template <typename T, bool Symmetrize, int... M>
constexpr auto Factors(std::integer_sequence<int, M...>) {
  return std::array<void (*)(Real<T>*, int32_t*), sizeof...(M)>{&Factor<T, M + 1, Symmetrize>...};
}
template <typename T, int... M>
constexpr auto Solves(std::integer_sequence<int, M...>) {
  return std::array<void (*)(const Real<T>*, Real<T>*, int64_t), sizeof...(M)>{
      &Solve<T, M + 1>...};
}

template <typename T, bool Symmetrize>
inline constexpr auto kFactors =
    Factors<T, Symmetrize>(std::make_integer_sequence<int, kMaxFixedCholesky>{});
template <typename T>
inline constexpr auto kSolves = Solves<T>(std::make_integer_sequence<int, kMaxFixedCholesky>{});

#endif  // BATCHPART_FIXED_SIZE

}  // namespace

template <typename T>
bool FactorFixedCholesky(Group<T>& g, bool symmetrize, int32_t* info) {
#if BATCHPART_FIXED_SIZE
  const int64_t n = g.rows();
  if (!HasFixedSizeKernel(n, g.cols(), kMaxFixedCholesky)) return false;
  (symmetrize ? kFactors<T, true> : kFactors<T, false>)[n - 1](g.re(0, 0), info);
  return true;
#else
  return false;
#endif
}

template <typename T>
bool SolveFixedCholesky(const Group<T>& factor, Group<T>& x) {
#if BATCHPART_FIXED_SIZE
  const int64_t n = factor.rows();
  if (!HasFixedSizeKernel(n, factor.cols(), kMaxFixedCholesky)) return false;
  kSolves<T>[n - 1](factor.re(0, 0), x.re(0, 0), x.cols());
  return true;
#else
  return false;
#endif
}

template bool FactorFixedCholesky<float>(Group<float>&, bool, int32_t*);
template bool FactorFixedCholesky<double>(Group<double>&, bool, int32_t*);
template bool SolveFixedCholesky<float>(const Group<float>&, Group<float>&);
template bool SolveFixedCholesky<double>(const Group<double>&, Group<double>&);

}  // namespace batchpart::lapack::interleaved
