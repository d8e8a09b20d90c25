#include "lapack/small_lu_fixed.h"

#include <array>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>

// Where the CPU has AVX-512 is BlockTransposes()' to say (interleaved.cc).
#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define BATCHPART_FIXED_LU 1
#endif

namespace batchpart::lapack::interleaved {
namespace {

#if BATCHPART_FIXED_LU

// Every function here is compiled for AVX-512 and runs only where the CPU
// has it; the steps are inlined into each size's kernel.
#define BATCHPART_AVX512 __attribute__((target("avx512f")))
#define BATCHPART_STEP __attribute__((always_inline, target("avx512f"))) inline

template <typename T>
using Vec = typename LaneVector<T>::type;

// Whether any lane of a lane comparison's result is set: AnyLane
// (interleaved.h) in one test of a mask register, which AVX-512 code can
// use; AnyLane's word-by-word OR serves every instruction set.
template <typename Mask>
BATCHPART_STEP bool Any(const Mask& mask) {
  static_assert(sizeof(Mask) == sizeof(__m512i));
  __m512i bits;
  std::memcpy(&bits, &mask, sizeof(bits));
  return _mm512_test_epi32_mask(bits, bits) != 0;
}

// The pivot row's element of a column whose rows K.. are c[K..N): c[i] on
// the lanes whose pivot is row i (eq[i]), c[K] on those that keep row K.
template <typename T, int N, int K, typename Mask>
BATCHPART_STEP Vec<T> PivotElement(const Vec<T> (&c)[N], const Mask (&eq)[N]) {
  Vec<T> u = c[K];
#pragma GCC unroll 64
  for (int i = K + 1; i < N; ++i) u = eq[i] ? c[i] : u;
  return u;
}

template <typename T, int N, int K, bool WholeRows>
BATCHPART_AVX512 __attribute__((noinline)) void AbnormalStep(const Planes<T>& a, int32_t* pivots,
                                                             Vec<T>& failed);

// Step K of getf2 on the group's N x N matrices: the pivot search, the row
// swap, the multipliers and the update of the trailing columns, with
// FactorLanes' arithmetic. Abnormal (a lane's pivot column is zero or its
// pivot below the smallest normal; taken out of line, as rare): the zero
// lanes skip the step, their info the first such column, and the tiny
// pivots divide instead of multiplying by their reciprocal, as getf2.
template <typename T, int N, int K, bool WholeRows, bool Abnormal>
BATCHPART_STEP void Step(const Planes<T>& a, int32_t* pivots, Vec<T>& failed) {
  using R = Real<T>;
  using V = Vec<T>;
  using Mask = decltype(V{} < V{});
  constexpr int W = kLanes<T>;
  constexpr R kTiny = std::numeric_limits<R>::min();

  // Each lane's pivot: the first row of largest magnitude.
  V col[N], top, at = V{} + R(K);
#pragma GCC unroll 64
  for (int i = K; i < N; ++i) col[i] = LoadLanes(a.Re(i, K));
  top = col[K] < 0 ? -col[K] : col[K];
#pragma GCC unroll 64
  for (int i = K + 1; i < N; ++i) {
    const V v = col[i] < 0 ? -col[i] : col[i];
    const Mask larger = v > top;
    top = larger ? v : top;
    at = larger ? V{} + R(i) : at;
  }
  if constexpr (!Abnormal) {
    // NaN pivots go there too; they come out as FactorLanes has them.
    if (Any(!(top >= kTiny))) return AbnormalStep<T, N, K, WholeRows>(a, pivots, failed);
  }
  alignas(64) R at_lanes[W];
  StoreLanes(at_lanes, at);
  _Pragma("GCC ivdep") for (int l = 0; l < W; ++l) {
    pivots[K * W + l] = static_cast<int32_t>(at_lanes[l]);
  }
  Mask eq[N];
#pragma GCC unroll 64
  for (int i = K + 1; i < N; ++i) eq[i] = at == R(i);
  [[maybe_unused]] const Mask zero = top == V{};
  if constexpr (Abnormal) failed = (zero & (failed == V{})) ? V{} + R(K + 1) : failed;

  // Column K: the pivot to the diagonal, the multipliers below it.
  const V pivot = PivotElement<T, N, K>(col, eq);
  const V inv = R(1) / pivot;
  V l[N];
#pragma GCC unroll 64
  for (int i = K + 1; i < N; ++i) {
    const V x = eq[i] ? col[K] : col[i];
    l[i] = x * inv;
    if constexpr (Abnormal) l[i] = zero ? x : top < kTiny ? x / pivot : l[i];
    StoreLanes(a.Re(i, K), l[i]);
  }
  StoreLanes(a.Re(K, K), pivot);

  // The trailing columns: swapped and updated, each in registers once. A
  // loop (the rows unrolled, the columns not): every column runs the same
  // code on the same registers, and unrolled the kernels grew as N^3.
#pragma GCC unroll 1
  for (int j = K + 1; j < N; ++j) {
    V c[N];
#pragma GCC unroll 64
    for (int i = K; i < N; ++i) c[i] = LoadLanes(a.Re(i, j));
    // Row i's two blends together: where the masks spill, one reload each.
    V u = c[K], xs[N];
#pragma GCC unroll 64
    for (int i = K + 1; i < N; ++i) {
      xs[i] = eq[i] ? c[K] : c[i];
      u = eq[i] ? c[i] : u;
    }
    StoreLanes(a.Re(K, j), u);
#pragma GCC unroll 64
    for (int i = K + 1; i < N; ++i) {
      const V x = xs[i];
      V y = x - l[i] * u;
      if constexpr (Abnormal) y = zero ? x : y;
      StoreLanes(a.Re(i, j), y);
    }
  }

  // The earlier columns the swap reaches (all, or those of K's block).
  constexpr int kFrom = WholeRows ? 0 : K - K % kLuBlockSteps;
  if (kFrom < K && Any(at != R(K))) {
#pragma GCC unroll 1
    for (int j = kFrom; j < K; ++j) {
      V c[N];
#pragma GCC unroll 64
      for (int i = K; i < N; ++i) c[i] = LoadLanes(a.Re(i, j));
      V u = c[K];
#pragma GCC unroll 64
      for (int i = K + 1; i < N; ++i) {
        StoreLanes(a.Re(i, j), eq[i] ? c[K] : c[i]);
        u = eq[i] ? c[i] : u;
      }
      StoreLanes(a.Re(K, j), u);
    }
  }
}

template <typename T, int N, int K, bool WholeRows>
BATCHPART_AVX512 __attribute__((noinline)) void AbnormalStep(const Planes<T>& a, int32_t* pivots,
                                                             Vec<T>& failed) {
  Step<T, N, K, WholeRows, true>(a, pivots, failed);
}

// getf2 on a group of N x N matrices in place; pivots and info as
// FactorGroup writes them.
template <typename T, int N, bool WholeRows, int... K>
BATCHPART_AVX512 void FactorSteps(Real<T>* re, int32_t* pivots, int32_t* info,
                                  std::integer_sequence<int, K...>) {
  using R = Real<T>;
  const Planes<T> a{re, nullptr, N};
  Vec<T> failed{};  // info as lane values
  (Step<T, N, K, WholeRows, false>(a, pivots, failed), ...);
  alignas(64) R failed_lanes[kLanes<T>];
  StoreLanes(failed_lanes, failed);
  _Pragma("GCC ivdep") for (int l = 0; l < kLanes<T>; ++l) {
    info[l] = static_cast<int32_t>(failed_lanes[l]);
  }
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
#pragma GCC unroll 64
    for (int i = 0; i < N; ++i) v[i] = LoadLanes(x.Re(i, j));
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
#pragma GCC unroll 64
    for (int i = 0; i < N; ++i) StoreLanes(x.Re(i, j), v[i]);
  }
}

template <typename T, int N, bool WholeRows>
void Factor(Real<T>* re, int32_t* pivots, int32_t* info) {
  FactorSteps<T, N, WholeRows>(re, pivots, info, std::make_integer_sequence<int, N>{});
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

#undef BATCHPART_STEP
#undef BATCHPART_AVX512

#endif  // BATCHPART_FIXED_LU

// Whether an n x n group has a fixed-size kernel that this CPU (under
// SetBlockTransposes' cap) runs.
[[maybe_unused]] bool HasKernel(int64_t rows, int64_t cols) {
  return rows == cols && rows >= 1 && rows <= kMaxFixedLu && BlockTransposes() == Isa::kAvx512;
}

}  // namespace

template <typename T>
bool FactorFixedSize(Group<T>& g, RowSwaps swaps, int32_t* pivots, int32_t* info) {
#if BATCHPART_FIXED_LU
  const int64_t n = g.rows();
  if (!HasKernel(n, g.cols())) return false;
  (swaps == RowSwaps::kWholeRows ? kKernels<T, true> : kKernels<T, false>)[n - 1](
      g.re(0, 0), pivots, info);
  return true;
#else
  return false;
#endif
}

template <typename T>
bool SolveFixedSize(const Group<T>& lu, const int32_t* pivots, Group<T>& x) {
#if BATCHPART_FIXED_LU
  const int64_t n = lu.rows();
  if (!HasKernel(n, lu.cols())) return false;
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
