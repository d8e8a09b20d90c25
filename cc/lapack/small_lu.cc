#include "lapack/small_lu.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <complex>
#include <cstring>
#include <cstdint>
#include <limits>
#include <utility>

#include "lapack/lapack_api.h"
#include "lapack/scalar_types.h"
#include "lapack/small_lu_fixed.h"

namespace batchpart::lapack::interleaved {
namespace {

// The helpers below are always inlined, so that the kernels compiled per
// instruction set (target_clones) get each loop compiled for it too; a call
// would run the default build.
#define BATCHPART_INLINE [[gnu::always_inline]] inline

// Marks a loop over the lanes. Lane l reads and writes index l of every
// operand only, so the iterations are independent even where two operands
// are the same element (ivdep: no alias check needed); kept a loop (unroll
// 1) so that the loop vectorizer, not the unroller, gets it: unrolled into
// scalar statements first, GCC left them scalar.
#define BATCHPART_LANES _Pragma("GCC ivdep") _Pragma("GCC unroll 1")

// The pivot magnitudes (|re| + |im|) of element (i, j)'s lanes.
template <typename T>
BATCHPART_INLINE void Magnitudes(const Planes<T>& a, int64_t i, int64_t j,
                                 typename LaneVector<T>::type& v) {
  typename LaneVector<T>::type part;
  std::memcpy(&part, a.Re(i, j), sizeof(part));
  v = part < 0 ? -part : part;
  if constexpr (kIsComplex<T>) {
    std::memcpy(&part, a.Im(i, j), sizeof(part));
    v += part < 0 ? -part : part;
  }
}

// x - l * u on one element's lanes (x's planes xr and xi; xi, li and ui
// unused for real T), as getf2's update computes it. Masked: only on the
// lanes where `on` is nonzero; the others keep x exactly (0 * inf would make
// a NaN of it).
template <typename T, bool Masked, typename V>
BATCHPART_INLINE void SubtractProduct(V& xr, V& xi, const V& lr, const V& li, const V& ur,
                                      const V& ui, const V& on) {
  V new_re;
  if constexpr (kIsComplex<T>) {
    new_re = xr - (lr * ur - li * ui);
    const V new_im = xi - (lr * ui + li * ur);
    xi = Masked ? (on != 0 ? new_im : xi) : new_im;
  } else {
    new_re = xr - lr * ur;
  }
  xr = Masked ? (on != 0 ? new_re : xr) : new_re;
}

// Row i of `x` over columns [j_begin, cols) minus l times row k, l being
// one element's lanes (lr, and li for complex T).
template <typename T>
BATCHPART_INLINE void SubtractRow(const Planes<T>& x, int64_t i, int64_t k, const Real<T>* lr,
                                  const Real<T>* li, int64_t j_begin) {
  using V = typename LaneVector<T>::type;
  const V l_re = LoadLanes(lr), none{};
  [[maybe_unused]] V l_im{};
  if constexpr (kIsComplex<T>) l_im = LoadLanes(li);
  for (int64_t j = j_begin; j < x.cols; ++j) {
    V xr = LoadLanes(x.Re(i, j)), xi{}, ur = LoadLanes(x.Re(k, j)), ui{};
    if constexpr (kIsComplex<T>) xi = LoadLanes(x.Im(i, j)), ui = LoadLanes(x.Im(k, j));
    SubtractProduct<T, false>(xr, xi, l_re, l_im, ur, ui, none);
    StoreLanes(x.Re(i, j), xr);
    if constexpr (kIsComplex<T>) StoreLanes(x.Im(i, j), xi);
  }
}

// The factorization runs kLuBlockSteps elimination steps at a time: each
// step's pivot column and pivot row are brought up to date with the block's
// earlier steps as they are needed, and the rest of the trailing block takes
// the block's steps in one pass, each element loaded and stored once per
// block instead of once per step. Every element still takes the steps'
// products one by one in step order, so the values are getf2's bit for bit.
// For a solve, a step's row swap moves only the columns from its block on
// (the block's pending updates need their rows' multipliers): the solve
// applies each block's swaps just before that block's columns of L.
// Measured single-threaded, random 16 x 16 float64 / float32, factor only
// (2 steps per block and swaps from the block on, against 1 step and
// whole-row swaps): 0.34 -> 0.28 / 0.23 -> 0.18 us per matrix; 4 steps per
// block saved less. Swapping the earlier columns of getrf's result after
// unpacking, row by row per matrix, cost more than it saved (8 x 8 float32:
// 0.077 -> 0.098 us with pack and unpack), so getrf swaps whole rows.

// Elements (i, j), i in [i_begin, i_end), j in [j_begin, j_end), minus
// l(i, t) * u(t, j) for the Steps steps t = t0, t0 + 1, ..., in that order;
// step s only on the lanes where on[s] is nonzero when Masked.
template <typename T, bool Masked, int Steps>
BATCHPART_INLINE void SubtractSteps(const Planes<T>& a, int64_t i_begin, int64_t i_end,
                                    int64_t j_begin, int64_t j_end, int64_t t0,
                                    const Real<T> (*on)[kLanes<T>]) {
  using V = typename LaneVector<T>::type;
  [[maybe_unused]] V mask[Steps];
  if constexpr (Masked) {
    for (int s = 0; s < Steps; ++s) mask[s] = LoadLanes(on[s]);
  }
  for (int64_t i = i_begin; i < i_end; ++i) {
    V lr[Steps], li[Steps];
    for (int s = 0; s < Steps; ++s) {
      lr[s] = LoadLanes(a.Re(i, t0 + s));
      li[s] = kIsComplex<T> ? LoadLanes(a.Im(i, t0 + s)) : V{};
    }
    for (int64_t j = j_begin; j < j_end; ++j) {
      V xr = LoadLanes(a.Re(i, j)), xi{};
      if constexpr (kIsComplex<T>) xi = LoadLanes(a.Im(i, j));
      for (int s = 0; s < Steps; ++s) {
        const V ur = LoadLanes(a.Re(t0 + s, j));
        const V ui = kIsComplex<T> ? LoadLanes(a.Im(t0 + s, j)) : V{};
        SubtractProduct<T, Masked>(xr, xi, lr[s], li[s], ur, ui,
                                   Masked ? mask[s] : V{});
      }
      StoreLanes(a.Re(i, j), xr);
      if constexpr (kIsComplex<T>) StoreLanes(a.Im(i, j), xi);
    }
  }
}

// SubtractSteps for a run-time number of steps, 0 to kLuBlockSteps.
template <typename T, bool Masked>
BATCHPART_INLINE void SubtractSteps(int steps, const Planes<T>& a, int64_t i_begin,
                                    int64_t i_end, int64_t j_begin, int64_t j_end, int64_t t0,
                                    const Real<T> (*on)[kLanes<T>]) {
  static_assert(kLuBlockSteps == 2);
  switch (steps) {
    case 1: return SubtractSteps<T, Masked, 1>(a, i_begin, i_end, j_begin, j_end, t0, on);
    case 2: return SubtractSteps<T, Masked, 2>(a, i_begin, i_end, j_begin, j_end, t0, on);
    default: return;
  }
}

// Swaps rows r and p[l] of lane l over columns [j_begin, cols), for lanes
// whose p differs from r. A scalar loop: each lane swaps its own pair of
// rows (on this CPU, masked vector exchanges moved no less memory).
template <typename T>
BATCHPART_INLINE void SwapRows(const Planes<T>& a, int64_t r, const int32_t* p,
                               int64_t j_begin = 0) {
  for (int l = 0; l < kLanes<T>; ++l) {
    if (p[l] == r) continue;
    for (int64_t j = j_begin; j < a.cols; ++j) {
      std::swap(a.Re(r, j)[l], a.Re(p[l], j)[l]);
      if constexpr (kIsComplex<T>) std::swap(a.Im(r, j)[l], a.Im(p[l], j)[l]);
    }
  }
}

// x (parts xr, xi) times the inverse (inv_re, inv_im) of the complex
// `pivot`, as the common path of FactorLanes multiplies, or divided by the
// pivot where it is below the smallest normal number (getf2): the same
// value whichever path the lane's group takes.
template <typename R>
BATCHPART_INLINE void Multiplier(std::complex<R> pivot, R inv_re, R inv_im, R& xr, R& xi) {
  if (std::abs(pivot) < std::numeric_limits<R>::min()) {
    const std::complex<R> y = std::complex<R>(xr, xi) / pivot;
    xr = y.real();
    xi = y.imag();
    return;
  }
  const R r = xr * inv_re - xi * inv_im;
  xi = xr * inv_im + xi * inv_re;
  xr = r;
}

template <typename T>
#if defined(__GNUC__) && defined(__x86_64__) && defined(__linux__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
void FactorLanes(int64_t m, int64_t n, Real<T>* re, Real<T>* im, bool whole_rows,
                 int32_t* pivots, int32_t* info) {
  using R = Real<T>;
  using Vec = typename LaneVector<T>::type;
  constexpr int W = kLanes<T>;
  const Planes<T> a{re, im, n};
  BATCHPART_LANES
  for (int l = 0; l < W; ++l) info[l] = 0;
  const int64_t k_end = m < n ? m : n;
  for (int64_t k0 = 0; k0 < k_end; k0 += kLuBlockSteps) {
    const int64_t block_end = std::min(k_end, k0 + kLuBlockSteps);
    const int64_t j_rest = block_end;  // the columns after the block's
    // The lanes each of the block's steps updates (all but those whose
    // pivot column was zero), and whether any step skips a lane.
    alignas(64) R on[kLuBlockSteps][W];
    bool masked = false;
    for (int64_t k = k0; k < block_end; ++k) {
      const int done = static_cast<int>(k - k0);  // the block's steps before k
      // Column k up to date: rows k0 + 1 .. k of it are U and take the steps
      // before their own row; the rows below take all of them.
      for (int64_t i = k0 + 1; i <= k && i < m; ++i) {
        const int steps = static_cast<int>(i - k0);
        masked ? SubtractSteps<T, true>(steps, a, i, i + 1, k, k + 1, k0, on)
               : SubtractSteps<T, false>(steps, a, i, i + 1, k, k + 1, k0, on);
      }
      masked ? SubtractSteps<T, true>(done, a, k + 1, m, k, k + 1, k0, on)
             : SubtractSteps<T, false>(done, a, k + 1, m, k, k + 1, k0, on);

      // Each lane's pivot: the first row of largest magnitude (i?amax). A
      // vector type, not a loop over lanes: the search carries its maximum
      // from row to row, and as a loop GCC kept it in memory or left it
      // scalar.
      Vec top, at = Vec{} + static_cast<R>(k);
      Magnitudes<T>(a, k, k, top);
      for (int64_t i = k + 1; i < m; ++i) {
        Vec v;
        Magnitudes<T>(a, i, k, v);
        const auto larger = v > top;
        top = larger ? v : top;
        at = larger ? Vec{} + static_cast<R>(i) : at;
      }
      alignas(64) R row[W];
      std::memcpy(row, &at, sizeof(Vec));
      alignas(64) int32_t p[W];
      BATCHPART_LANES
      for (int l = 0; l < W; ++l) p[l] = pivots[k * W + l] = static_cast<int32_t>(row[l]);
      // A zero largest magnitude means an all-zero column (a NaN never wins
      // against a zero diagonal, as in i?amax): the pivot stays in place and
      // the lane skips this step. The flags are lane vectors and their
      // reductions: as loops with a flag carried across lanes they ran lane
      // by lane, a visible part of a small matrix's step.
      const auto zero = top == Vec{};
      const bool any_zero = AnyLane(zero);
      R* active = on[done];
      StoreLanes(active, zero ? Vec{} : Vec{} + R(1));
      if (any_zero) {
        masked = true;
        for (int l = 0; l < W; ++l) {
          if (active[l] == 0 && info[l] == 0) info[l] = static_cast<int32_t>(k + 1);
        }
      }
      SwapRows(a, k, p, whole_rows ? 0 : k0);
      // Row k (now the pivot row) up to date after the block.
      masked ? SubtractSteps<T, true>(done, a, k, k + 1, j_rest, n, k0, on)
             : SubtractSteps<T, false>(done, a, k, k + 1, j_rest, n, k0, on);

      // Multipliers: times the pivot's reciprocal, except where that would
      // overflow (a pivot below the smallest normal), as getf2.
      alignas(64) R inv_re[W];
      [[maybe_unused]] alignas(64) R inv_im[W];
      bool any_tiny = false;
      const R* pr = a.Re(k, k);
      [[maybe_unused]] const R* pi = kIsComplex<T> ? a.Im(k, k) : nullptr;
      if constexpr (kIsComplex<T>) {
        BATCHPART_LANES
        for (int l = 0; l < W; ++l) {
          const std::complex<R> pivot(pr[l], pi[l]);
          const std::complex<R> inverse = R(1) / pivot;
          inv_re[l] = inverse.real();
          inv_im[l] = inverse.imag();
          any_tiny |= (!any_zero || active[l] != 0) &&
                      std::abs(pivot) < std::numeric_limits<R>::min();
        }
      } else {
        const Vec pivot = LoadLanes(pr);
        StoreLanes(inv_re, R(1) / pivot);
        const auto tiny = (pivot < 0 ? -pivot : pivot) < std::numeric_limits<R>::min();
        any_tiny = any_zero ? AnyLane(tiny & ~zero) : AnyLane(tiny);
      }
      if (!any_zero && !any_tiny) {
        for (int64_t i = k + 1; i < m; ++i) {
          R* __restrict xr = a.Re(i, k);
          if constexpr (kIsComplex<T>) {
            R* __restrict xi = a.Im(i, k);
            BATCHPART_LANES
            for (int l = 0; l < W; ++l) {
              const R r = xr[l] * inv_re[l] - xi[l] * inv_im[l];
              xi[l] = xr[l] * inv_im[l] + xi[l] * inv_re[l];
              xr[l] = r;
            }
          } else {
            BATCHPART_LANES
            for (int l = 0; l < W; ++l) xr[l] *= inv_re[l];
          }
        }
      } else {
        // Rare: lane by lane, with the scalar arithmetic of RowMajorLu.
        for (int64_t i = k + 1; i < m; ++i) {
          BATCHPART_LANES
          for (int l = 0; l < W; ++l) {
            if (active[l] == 0) continue;
            if constexpr (kIsComplex<T>) {
              const std::complex<R> pivot(pr[l], pi[l]);
              Multiplier(pivot, inv_re[l], inv_im[l], a.Re(i, k)[l], a.Im(i, k)[l]);
            } else {
              R& x = a.Re(i, k)[l];
              x = std::abs(pr[l]) < std::numeric_limits<R>::min() ? x / pr[l] : x * inv_re[l];
            }
          }
        }
      }
    }
    // The trailing block takes the block's steps in one pass. Within the
    // block, columns k0 .. block_end - 1 were brought up to date step by step.
    const int steps = static_cast<int>(block_end - k0);
    masked ? SubtractSteps<T, true>(steps, a, block_end, m, j_rest, n, k0, on)
           : SubtractSteps<T, false>(steps, a, block_end, m, j_rest, n, k0, on);
  }
}

// x /= d on every lane. Complex division scales by the larger part of d
// first, so that |d|^2 neither overflows nor underflows.
template <typename T>
BATCHPART_INLINE void DivideLanes(const Planes<T>& x, int64_t i, int64_t j, const Real<T>* dr,
                                  const Real<T>* di) {
  constexpr int W = kLanes<T>;
  using R = Real<T>;
  R* __restrict xr = x.Re(i, j);
  if constexpr (kIsComplex<T>) {
    R* __restrict xi = x.Im(i, j);
    BATCHPART_LANES
    for (int l = 0; l < W; ++l) {
      const R scale = std::fmax(std::abs(dr[l]), std::abs(di[l]));
      const R cr = dr[l] / scale, ci = di[l] / scale;
      const R denominator = (cr * cr + ci * ci) * scale;
      const R r = (xr[l] * cr + xi[l] * ci) / denominator;
      xi[l] = (xi[l] * cr - xr[l] * ci) / denominator;
      xr[l] = r;
    }
  } else {
    BATCHPART_LANES
    for (int l = 0; l < W; ++l) xr[l] /= dr[l];
  }
}

template <typename T>
#if defined(__GNUC__) && defined(__x86_64__) && defined(__linux__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
void SolveLanes(int64_t n, int64_t r, const Real<T>* lu_re, const Real<T>* lu_im,
                const int32_t* pivots, Real<T>* x_re, Real<T>* x_im) {
  using R = Real<T>;
  constexpr int W = kLanes<T>;
  const Planes<T> lu{const_cast<R*>(lu_re), const_cast<R*>(lu_im), n};
  const Planes<T> x{x_re, x_im, r};
  // L Y = P B (unit diagonal), then U X = Y, column by column as the
  // reference trsm: once row k of the solution is known it is taken off the
  // rows still to come, so one step's updates are independent of each other
  // (row by row, each element would be one chain of dependent updates).
  // A block's columns of L hold their rows as the block left them, so each
  // block's swaps come just before its columns.
  for (int64_t k0 = 0; k0 < n; k0 += kLuBlockSteps) {
    const int64_t block_end = std::min(n, k0 + kLuBlockSteps);
    for (int64_t k = k0; k < block_end; ++k) SwapRows(x, k, pivots + k * W);
    for (int64_t k = k0; k < block_end; ++k) {
      for (int64_t i = k + 1; i < n; ++i) {
        SubtractRow(x, i, k, lu.Re(i, k), kIsComplex<T> ? lu.Im(i, k) : nullptr, 0);
      }
    }
  }
  for (int64_t k = n - 1; k >= 0; --k) {
    const R* dr = lu.Re(k, k);
    const R* di = kIsComplex<T> ? lu.Im(k, k) : nullptr;
    for (int64_t j = 0; j < r; ++j) DivideLanes(x, k, j, dr, di);
    for (int64_t i = 0; i < k; ++i) {
      SubtractRow(x, i, k, lu.Re(i, k), kIsComplex<T> ? lu.Im(i, k) : nullptr, 0);
    }
  }
}

// The swaps as blends on lane vectors: row s of the permutation stays in a
// register while the rows below take their turn (as a loop over lanes, each
// row's store was the next one's load).
template <int W>
#if defined(__GNUC__) && defined(__x86_64__) && defined(__linux__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
void PermutationLanes(const int32_t* pivots, int64_t k, int64_t m, int32_t* perm) {
  typedef int32_t Ints __attribute__((vector_size(4 * W)));
  for (int64_t i = 0; i < m; ++i) {
    const Ints row = Ints{} + static_cast<int32_t>(i);
    std::memcpy(perm + i * W, &row, sizeof(row));
  }
  for (int64_t s = 0; s < k && s < m; ++s) {
    Ints p, top, row;
    std::memcpy(&p, pivots + s * W, sizeof(p));
    std::memcpy(&top, perm + s * W, sizeof(top));
    for (int64_t i = s + 1; i < m; ++i) {
      std::memcpy(&row, perm + i * W, sizeof(row));
      const Ints swap = p == (Ints{} + static_cast<int32_t>(i));
      const Ints moved = swap ? top : row;
      std::memcpy(perm + i * W, &moved, sizeof(moved));
      top = swap ? row : top;
    }
    std::memcpy(perm + s * W, &top, sizeof(top));
  }
}

// FactorLanes on one row-major m x n matrix (planes re and im, element
// (i, j) at i * n + j), whole rows swapped: getf2's steps one at a time,
// each element taking FactorLanes' products in its order, and each pivot,
// multiplier and skipped step as FactorLanes has them for a lane. A step's
// row updates run along the rows. Returns getrf's info.
template <typename T>
#if defined(__GNUC__) && defined(__x86_64__) && defined(__linux__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
int32_t FactorOneLanes(int64_t m, int64_t n, Real<T>* __restrict re, Real<T>* __restrict im,
                       int32_t* pivots) {
  using R = Real<T>;
  const auto magnitude = [&](int64_t i, int64_t j) {
    const R x = re[i * n + j];
    R v = x < 0 ? -x : x;
    if constexpr (kIsComplex<T>) {
      const R y = im[i * n + j];
      v += y < 0 ? -y : y;
    }
    return v;
  };
  int32_t info = 0;
  const int64_t k_end = m < n ? m : n;
  for (int64_t k = 0; k < k_end; ++k) {
    int64_t p = k;
    R top = magnitude(k, k);
    for (int64_t i = k + 1; i < m; ++i) {
      const R v = magnitude(i, k);
      if (v > top) top = v, p = i;
    }
    pivots[k] = static_cast<int32_t>(p);
    if (top == R(0)) {
      if (info == 0) info = static_cast<int32_t>(k + 1);
      continue;
    }
    if (p != k) {
      std::swap_ranges(re + k * n, re + (k + 1) * n, re + p * n);
      if constexpr (kIsComplex<T>) std::swap_ranges(im + k * n, im + (k + 1) * n, im + p * n);
    }
    const R* __restrict ur = re + k * n;
    [[maybe_unused]] const R* __restrict ui = im + k * n;
    if constexpr (kIsComplex<T>) {
      const std::complex<R> pivot(ur[k], ui[k]);
      const std::complex<R> inverse = R(1) / pivot;
      for (int64_t i = k + 1; i < m; ++i) {
        Multiplier(pivot, inverse.real(), inverse.imag(), re[i * n + k], im[i * n + k]);
      }
    } else {
      const R inverse = R(1) / ur[k];
      const bool tiny = std::abs(ur[k]) < std::numeric_limits<R>::min();
      for (int64_t i = k + 1; i < m; ++i) {
        R& x = re[i * n + k];
        x = tiny ? x / ur[k] : x * inverse;
      }
    }
    for (int64_t i = k + 1; i < m; ++i) {
      R* __restrict xr = re + i * n;
      const R lr = xr[k];
      if constexpr (kIsComplex<T>) {
        R* __restrict xi = im + i * n;
        const R li = xi[k];
        for (int64_t j = k + 1; j < n; ++j) {
          const R new_re = xr[j] - (lr * ur[j] - li * ui[j]);
          xi[j] = xi[j] - (lr * ui[j] + li * ur[j]);
          xr[j] = new_re;
        }
      } else {
        for (int64_t j = k + 1; j < n; ++j) xr[j] = xr[j] - lr * ur[j];
      }
    }
  }
  return info;
}

// SolveLanes on one system: the n x n row-major LU and pivots
// FactorOneLanes left, and the row-major n x r x (planes). The swaps all
// come first, where SolveLanes applies each block's just before its columns
// of L: each row of x still takes the same multipliers in the same order.
template <typename T>
#if defined(__GNUC__) && defined(__x86_64__) && defined(__linux__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
void SolveOneLanes(int64_t n, int64_t r, const Real<T>* __restrict lu_re,
                   const Real<T>* __restrict lu_im, const int32_t* pivots, Real<T>* __restrict x_re,
                   Real<T>* __restrict x_im) {
  using R = Real<T>;
  for (int64_t k = 0; k < n; ++k) {
    const int64_t p = pivots[k];
    if (p == k) continue;
    std::swap_ranges(x_re + k * r, x_re + (k + 1) * r, x_re + p * r);
    if constexpr (kIsComplex<T>) std::swap_ranges(x_im + k * r, x_im + (k + 1) * r, x_im + p * r);
  }
  // Row i of x minus l times row k.
  const auto subtract_row = [&](int64_t i, int64_t k, R lr, R li) {
    R* __restrict yr = x_re + i * r;
    const R* __restrict ur = x_re + k * r;
    if constexpr (kIsComplex<T>) {
      R* __restrict yi = x_im + i * r;
      const R* __restrict ui = x_im + k * r;
      for (int64_t j = 0; j < r; ++j) {
        const R new_re = yr[j] - (lr * ur[j] - li * ui[j]);
        yi[j] = yi[j] - (lr * ui[j] + li * ur[j]);
        yr[j] = new_re;
      }
    } else {
      for (int64_t j = 0; j < r; ++j) yr[j] = yr[j] - lr * ur[j];
    }
  };
  const auto lu_im_at = [&](int64_t i, int64_t k) {
    if constexpr (kIsComplex<T>) return lu_im[i * n + k];
    return R(0);
  };
  for (int64_t k = 0; k < n; ++k) {
    for (int64_t i = k + 1; i < n; ++i) subtract_row(i, k, lu_re[i * n + k], lu_im_at(i, k));
  }
  for (int64_t k = n - 1; k >= 0; --k) {
    const R dr = lu_re[k * n + k];
    if constexpr (kIsComplex<T>) {
      const R di = lu_im[k * n + k];
      const R scale = std::fmax(std::abs(dr), std::abs(di));
      const R cr = dr / scale, ci = di / scale;
      const R denominator = (cr * cr + ci * ci) * scale;
      for (int64_t j = 0; j < r; ++j) {
        R& xr = x_re[k * r + j];
        R& xi = x_im[k * r + j];
        const R new_re = (xr * cr + xi * ci) / denominator;
        xi = (xi * cr - xr * ci) / denominator;
        xr = new_re;
      }
    } else {
      for (int64_t j = 0; j < r; ++j) x_re[k * r + j] /= dr;
    }
    for (int64_t i = 0; i < k; ++i) subtract_row(i, k, lu_re[i * n + k], lu_im_at(i, k));
  }
}

#undef BATCHPART_INLINE
#undef BATCHPART_LANES

}  // namespace

template <typename T>
void FactorGroup(Group<T>& g, RowSwaps swaps, int32_t* pivots, int32_t* info) {
  if constexpr (!kIsComplex<T>) {
    if (FactorFixedSize(g, swaps, pivots, info)) return;
  }
  FactorLanes<T>(g.rows(), g.cols(), g.re(0, 0), kIsComplex<T> ? g.im(0, 0) : nullptr,
                 swaps == RowSwaps::kWholeRows, pivots, info);
}

template <typename T>
void PermutationGroup(const int32_t* pivots, int64_t k, int64_t m, int32_t* perm) {
  PermutationLanes<kLanes<T>>(pivots, k, m, perm);
}

template <typename T>
void SolveGroup(const Group<T>& lu, const int32_t* pivots, Group<T>& x) {
  if constexpr (!kIsComplex<T>) {
    if (SolveFixedSize(lu, pivots, x)) return;
  }
  SolveLanes<T>(lu.rows(), x.cols(), lu.re(0, 0), kIsComplex<T> ? lu.im(0, 0) : nullptr, pivots,
                x.re(0, 0), kIsComplex<T> ? x.im(0, 0) : nullptr);
}

template <typename T>
int32_t FactorOne(Group<T, 1>& a, int32_t* pivots) {
  return FactorOneLanes<T>(a.rows(), a.cols(), a.re(0, 0), kIsComplex<T> ? a.im(0, 0) : nullptr,
                           pivots);
}

template <typename T>
void SolveOne(const Group<T, 1>& lu, const int32_t* pivots, Group<T, 1>& x) {
  SolveOneLanes<T>(lu.rows(), x.cols(), lu.re(0, 0), kIsComplex<T> ? lu.im(0, 0) : nullptr, pivots,
                   x.re(0, 0), kIsComplex<T> ? x.im(0, 0) : nullptr);
}

#define BATCHPART_INSTANTIATE(T)                                                 \
  template void FactorGroup<T>(Group<T>&, RowSwaps, int32_t*, int32_t*);         \
  template void SolveGroup<T>(const Group<T>&, const int32_t*, Group<T>&);       \
  template void PermutationGroup<T>(const int32_t*, int64_t, int64_t, int32_t*); \
  template int32_t FactorOne<T>(Group<T, 1>&, int32_t*);                         \
  template void SolveOne<T>(const Group<T, 1>&, const int32_t*, Group<T, 1>&);
BATCHPART_FOR_EACH_SCALAR(BATCHPART_INSTANTIATE)
#undef BATCHPART_INSTANTIATE


}  // namespace batchpart::lapack::interleaved
