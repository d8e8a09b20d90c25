#include "lapack/small_lu_fixed.h"

#include <array>
#include <cstdint>
#include <limits>
#include <utility>

#include "lapack/fixed_size.h"

namespace batchpart::lapack::interleaved {
namespace {

#if BATCHPART_FIXED_SIZE

template <typename T, int N, int K, bool WholeRows>
BATCHPART_AVX512 __attribute__((noinline)) void AbnormalStep(const Planes<T>& a, int32_t* pivots,
                                                             Vec<T>& failed);

// Step K's pivot search on rows K.. of a column in registers: each lane's
// first row of largest magnitude (at) and that magnitude (top).
template <typename T, int N, int K>
BATCHPART_STEP void SearchPivot(const Vec<T> (&col)[N], Vec<T>& top, Vec<T>& at) {
  using R = Real<T>;
  using V = Vec<T>;
  at = V{} + R(K);
  top = col[K] < 0 ? -col[K] : col[K];
#pragma GCC unroll 64
  for (int i = K + 1; i < N; ++i) {
    const V v = col[i] < 0 ? -col[i] : col[i];
    const auto larger = v > top;
    top = larger ? v : top;
    at = larger ? V{} + R(i) : at;
  }
}

// Whether some lane's pivot is zero, NaN or below the smallest normal: the
// abnormal step's cases.
template <typename T>
BATCHPART_STEP bool AnyAbnormal(const Vec<T>& top) {
  return Any(!(top >= std::numeric_limits<Real<T>>::min()));
}

// What eliminating step K from a column takes: the lanes whose pivot is row
// i (eq[i], i > K), row i's multiplier (l[i], after the swap) and the lanes
// that skip the step (zero, for Abnormal steps).
template <typename T, int N>
struct Elimination {
  using Mask = decltype(Vec<T>{} < Vec<T>{});
  Mask eq[N];
  Vec<T> l[N];
  Mask zero;
};

// Step K's swap of rows K.. of a column in registers: row K and the pivot
// row trade elements. Row i's two blends sit together, so that where the
// masks spill one reload serves both.
template <typename T, int N, int K>
BATCHPART_STEP void Swap(Vec<T> (&c)[N], const Elimination<T, N>& e) {
  Vec<T> u = c[K];
#pragma GCC unroll 64
  for (int i = K + 1; i < N; ++i) {
    const Vec<T> row = c[i];
    c[i] = e.eq[i] ? c[K] : row;
    u = e.eq[i] ? row : u;
  }
  c[K] = u;
}

// Step K's column, its rows K.. in registers (swapped in place) with their
// pivot search: writes the lanes' pivots, the pivot to the diagonal and the
// multipliers below it, and fills e. Abnormal: see Step.
template <typename T, int N, int K, bool Abnormal>
BATCHPART_STEP void PivotColumn(const Planes<T>& a, Vec<T> (&col)[N], const Vec<T>& top,
                                const Vec<T>& at, int32_t* pivots, Vec<T>& failed,
                                Elimination<T, N>& e) {
  using R = Real<T>;
  using V = Vec<T>;
  constexpr int W = kLanes<T>;
  constexpr R kTiny = std::numeric_limits<R>::min();
  StoreLaneInts<T>(at, pivots + K * W);
#pragma GCC unroll 64
  for (int i = K + 1; i < N; ++i) e.eq[i] = at == R(i);
  e.zero = top == V{};
  if constexpr (Abnormal) failed = (e.zero & (failed == V{})) ? V{} + R(K + 1) : failed;
  Swap<T, N, K>(col, e);
  const V pivot = col[K];
  const V inv = R(1) / pivot;
#pragma GCC unroll 64
  for (int i = K + 1; i < N; ++i) {
    const V x = col[i];
    e.l[i] = x * inv;
    if constexpr (Abnormal) e.l[i] = e.zero ? x : top < kTiny ? x / pivot : e.l[i];
    StoreLanes(a.Re(i, K), e.l[i]);
  }
  StoreLanes(a.Re(K, K), pivot);
}

// Step K on one trailing column's rows K.. in registers: the swap (row K
// takes the pivot row's element u), then x - l * u below (Abnormal: x on
// the lanes that skip the step).
template <typename T, int N, int K, bool Abnormal>
BATCHPART_STEP void Eliminate(Vec<T> (&c)[N], const Elimination<T, N>& e) {
  Swap<T, N, K>(c, e);
#pragma GCC unroll 64
  for (int i = K + 1; i < N; ++i) {
    const Vec<T> y = c[i] - e.l[i] * c[K];
    c[i] = Abnormal ? (e.zero ? c[i] : y) : y;
  }
}

// Rows From.. of column j into registers and back.
template <typename T, int N, int From>
BATCHPART_STEP void LoadColumn(const Planes<T>& a, int j, Vec<T> (&c)[N]) {
#pragma GCC unroll 64
  for (int i = From; i < N; ++i) c[i] = LoadLanes(a.Re(i, j));
}
template <typename T, int N, int From>
BATCHPART_STEP void StoreColumn(const Planes<T>& a, int j, const Vec<T> (&c)[N]) {
#pragma GCC unroll 64
  for (int i = From; i < N; ++i) StoreLanes(a.Re(i, j), c[i]);
}

// Step K on the trailing columns from `first` on. A loop (the rows
// unrolled, the columns not): every column runs the same code on the same
// registers, and unrolled the kernels grew as N^3.
template <typename T, int N, int K, bool Abnormal>
BATCHPART_STEP void EliminateColumns(const Planes<T>& a, const Elimination<T, N>& e, int first) {
#pragma GCC unroll 1
  for (int j = first; j < N; ++j) {
    Vec<T> c[N];
    LoadColumn<T, N, K>(a, j, c);
    Eliminate<T, N, K, Abnormal>(c, e);
    StoreColumn<T, N, K>(a, j, c);
  }
}

// The swaps of steps K and (with Second) K + 1 on the earlier columns they
// reach (all, or those of K's block), each column loaded and stored once.
template <typename T, int N, int K, bool WholeRows, bool Second>
BATCHPART_STEP void SwapEarlierColumns(const Planes<T>& a, const Elimination<T, N>& e,
                                       const Vec<T>& at, const Elimination<T, N>& e2,
                                       const Vec<T>& at2) {
  constexpr int kFrom = WholeRows ? 0 : K - K % kLuBlockSteps;
  const bool first = kFrom < K && Any(at != Real<T>(K));
  const bool second = Second && Any(at2 != Real<T>(K + 1));
  if (!first && !second) return;
#pragma GCC unroll 1
  for (int j = kFrom; j < K; ++j) {
    Vec<T> c[N];
    LoadColumn<T, N, K>(a, j, c);
    Swap<T, N, K>(c, e);
    if constexpr (Second) Swap<T, N, K + 1>(c, e2);
    StoreColumn<T, N, K>(a, j, c);
  }
  // Column K, in K's block, takes step K + 1's swap in either mode.
  if constexpr (Second) {
    if (second) {
      Vec<T> c[N];
      LoadColumn<T, N, K + 1>(a, K, c);
      Swap<T, N, K + 1>(c, e2);
      StoreColumn<T, N, K + 1>(a, K, c);
    }
  }
}

// Step K of getf2 on the group's N x N matrices: the pivot search, the row
// swap, the multipliers and the update of the trailing columns, with
// FactorLanes' arithmetic. Abnormal (a lane's pivot column is zero or its
// pivot below the smallest normal; taken out of line, as rare): the zero
// lanes skip the step, their info the first such column, and the tiny
// pivots divide instead of multiplying by their reciprocal, as getf2.
template <typename T, int N, int K, bool WholeRows, bool Abnormal>
BATCHPART_STEP void Step(const Planes<T>& a, int32_t* pivots, Vec<T>& failed) {
  Vec<T> col[N], top, at;
  LoadColumn<T, N, K>(a, K, col);
  SearchPivot<T, N, K>(col, top, at);
  // NaN pivots take the abnormal step too; they come out as FactorLanes has them.
  if (!Abnormal && AnyAbnormal<T>(top)) return AbnormalStep<T, N, K, WholeRows>(a, pivots, failed);
  Elimination<T, N> e;
  PivotColumn<T, N, K, Abnormal>(a, col, top, at, pivots, failed, e);
  EliminateColumns<T, N, K, Abnormal>(a, e, K + 1);
  SwapEarlierColumns<T, N, K, WholeRows, false>(a, e, at, e, at);
}

template <typename T, int N, int K, bool WholeRows>
BATCHPART_AVX512 __attribute__((noinline)) void AbnormalStep(const Planes<T>& a, int32_t* pivots,
                                                             Vec<T>& failed) {
  Step<T, N, K, WholeRows, true>(a, pivots, failed);
}

// Steps K and K + 1 (one of FactorLanes' blocks): column K + 1 takes step
// K, then gives step K + 1 its pivot; each later column then takes both
// steps in registers, loaded and stored once where single steps loaded and
// stored it twice. Each element takes the same operations in the same order
// (a swap commutes with the other rows' updates), so the same values. Where
// either step is abnormal, it runs on its own, out of line.
template <typename T, int N, int K, bool WholeRows>
BATCHPART_STEP void TwoSteps(const Planes<T>& a, int32_t* pivots, Vec<T>& failed) {
  using V = Vec<T>;
  V col[N], top, at;
  LoadColumn<T, N, K>(a, K, col);
  SearchPivot<T, N, K>(col, top, at);
  if (AnyAbnormal<T>(top)) {
    AbnormalStep<T, N, K, WholeRows>(a, pivots, failed);
    return Step<T, N, K + 1, WholeRows, false>(a, pivots, failed);
  }
  Elimination<T, N> first;
  PivotColumn<T, N, K, false>(a, col, top, at, pivots, failed, first);

  V next[N], next_top, next_at;
  LoadColumn<T, N, K>(a, K + 1, next);
  Eliminate<T, N, K, false>(next, first);
  SearchPivot<T, N, K + 1>(next, next_top, next_at);
  if (AnyAbnormal<T>(next_top)) {
    StoreColumn<T, N, K>(a, K + 1, next);
    EliminateColumns<T, N, K, false>(a, first, K + 2);
    SwapEarlierColumns<T, N, K, WholeRows, false>(a, first, at, first, at);
    return AbnormalStep<T, N, K + 1, WholeRows>(a, pivots, failed);
  }
  StoreLanes(a.Re(K, K + 1), next[K]);
  Elimination<T, N> second;
  PivotColumn<T, N, K + 1, false>(a, next, next_top, next_at, pivots, failed, second);

#pragma GCC unroll 1
  for (int j = K + 2; j < N; ++j) {
    V c[N];
    LoadColumn<T, N, K>(a, j, c);
    Eliminate<T, N, K, false>(c, first);
    Eliminate<T, N, K + 1, false>(c, second);
    StoreColumn<T, N, K>(a, j, c);
  }
  SwapEarlierColumns<T, N, K, WholeRows, true>(a, first, at, second, next_at);
}

// Steps K and K + 1, or step K alone where it is the last.
template <typename T, int N, int K, bool WholeRows>
BATCHPART_STEP void Block(const Planes<T>& a, int32_t* pivots, Vec<T>& failed) {
  if constexpr (K + 1 < N) {
    TwoSteps<T, N, K, WholeRows>(a, pivots, failed);
  } else {
    Step<T, N, K, WholeRows, false>(a, pivots, failed);
  }
}

// getf2 on a group of N x N matrices in place; pivots and info as
// FactorGroup writes them.
template <typename T, int N, bool WholeRows, int... B>
BATCHPART_AVX512 void FactorSteps(Real<T>* re, int32_t* pivots, int32_t* info,
                                  std::integer_sequence<int, B...>) {
  static_assert(kLuBlockSteps == 2, "TwoSteps is one block");
  const Planes<T> a{re, nullptr, N};
  Vec<T> failed{};  // info as lane values
  (Block<T, N, 2 * B, WholeRows>(a, pivots, failed), ...);
  StoreLaneInts<T>(failed, info);
}

// SolveLanes (small_lu.cc) for one size: L Y = P B, then U X = Y, one
// column of B at a time with the column in registers; the swaps as blends,
// each block of kLuBlockSteps swaps before the block's columns of L (the
// factorization swapped only those columns from the block on). The same
// operations in the same order as SolveLanes, so the same bits.
template <typename T, int N>
BATCHPART_AVX512 void Solve(const Real<T>* lu_re, const int32_t* pivots, Real<T>* x_re,
                            int64_t r) {
  using R = Real<T>;
  using V = Vec<T>;
  constexpr int W = kLanes<T>;
  const Planes<T> lu{const_cast<R*>(lu_re), nullptr, N};
  const Planes<T> x{x_re, nullptr, r};
  V at[N];  // each step's pivot row, as lane values
#pragma GCC unroll 64
  for (int k = 0; k < N; ++k) {
    alignas(64) R rows[W];
    _Pragma("GCC ivdep") for (int l = 0; l < W; ++l) rows[l] = static_cast<R>(pivots[k * W + l]);
    at[k] = LoadLanes(rows);
  }
#pragma GCC unroll 1
  for (int64_t j = 0; j < r; ++j) {
    V v[N];
    LoadColumn<T, N>(x, j, v);
#pragma GCC unroll 64
    for (int k0 = 0; k0 < N; k0 += kLuBlockSteps) {
      const int block_end = k0 + kLuBlockSteps < N ? k0 + kLuBlockSteps : N;
#pragma GCC unroll 64
      for (int k = k0; k < block_end; ++k) {
        V u = v[k];
#pragma GCC unroll 64
        for (int i = k + 1; i < N; ++i) {
          const auto swap = at[k] == R(i);
          const V row = v[i];
          v[i] = swap ? u : row;
          u = swap ? row : u;
        }
        v[k] = u;
      }
#pragma GCC unroll 64
      for (int k = k0; k < block_end; ++k) {
#pragma GCC unroll 64
        for (int i = k + 1; i < N; ++i) v[i] = v[i] - LoadLanes(lu.Re(i, k)) * v[k];
      }
    }
#pragma GCC unroll 64
    for (int k = N - 1; k >= 0; --k) {
      v[k] = v[k] / LoadLanes(lu.Re(k, k));
#pragma GCC unroll 64
      for (int i = 0; i < k; ++i) v[i] = v[i] - LoadLanes(lu.Re(i, k)) * v[k];
    }
    StoreColumn<T, N>(x, j, v);
  }
}

template <typename T, int N, bool WholeRows>
void Factor(Real<T>* re, int32_t* pivots, int32_t* info) {
  FactorSteps<T, N, WholeRows>(re, pivots, info, std::make_integer_sequence<int, (N + 1) / 2>{});
}

// The kernels for n = 1 .. kMaxFixedLu, by n - 1.
template <typename T, bool WholeRows, int... M>
constexpr auto Kernels(std::integer_sequence<int, M...>) {
  return std::array<void (*)(Real<T>*, int32_t*, int32_t*), sizeof...(M)>{
      &Factor<T, M + 1, WholeRows>...};
}

// The solves for n = 1 .. kMaxFixedLu, by n - 1.
template <typename T, int... M>
constexpr auto Solves(std::integer_sequence<int, M...>) {
  return std::array<void (*)(const Real<T>*, const int32_t*, Real<T>*, int64_t), sizeof...(M)>{
      &Solve<T, M + 1>...};
}

template <typename T>
inline constexpr auto kSolves = Solves<T>(std::make_integer_sequence<int, kMaxFixedLu>{});

template <typename T, bool WholeRows>
inline constexpr auto kKernels = Kernels<T, WholeRows>(std::make_integer_sequence<int, kMaxFixedLu>{});

#endif  // BATCHPART_FIXED_SIZE

}  // namespace

template <typename T>
bool FactorFixedSize(Group<T>& g, RowSwaps swaps, int32_t* pivots, int32_t* info) {
#if BATCHPART_FIXED_SIZE
  const int64_t n = g.rows();
  if (!HasFixedSizeKernel(n, g.cols(), kMaxFixedLu)) return false;
  (swaps == RowSwaps::kWholeRows ? kKernels<T, true> : kKernels<T, false>)[n - 1](
      g.re(0, 0), pivots, info);
  return true;
#else
  return false;
#endif
}

template <typename T>
bool SolveFixedSize(const Group<T>& lu, const int32_t* pivots, Group<T>& x) {
#if BATCHPART_FIXED_SIZE
  const int64_t n = lu.rows();
  if (!HasFixedSizeKernel(n, lu.cols(), kMaxFixedLu)) return false;
  kSolves<T>[n - 1](lu.re(0, 0), pivots, x.re(0, 0), x.cols());
  return true;
#else
  return false;
#endif
}

template bool FactorFixedSize<float>(Group<float>&, RowSwaps, int32_t*, int32_t*);
template bool FactorFixedSize<double>(Group<double>&, RowSwaps, int32_t*, int32_t*);
template bool SolveFixedSize<float>(const Group<float>&, const int32_t*, Group<float>&);
template bool SolveFixedSize<double>(const Group<double>&, const int32_t*, Group<double>&);

}  // namespace batchpart::lapack::interleaved
