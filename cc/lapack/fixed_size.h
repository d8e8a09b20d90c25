// What the fixed-size interleaved kernels (small_lu_fixed.cc,
// small_cholesky_fixed.cc) share: one kernel per n, compiled for AVX-512
// and run only where the CPU has it, on lane vectors held in registers.
#ifndef BATCHPART_LAPACK_FIXED_SIZE_H_
#define BATCHPART_LAPACK_FIXED_SIZE_H_

#include <cstdint>
#include <cstring>

#include "lapack/interleaved.h"

// Where the CPU has AVX-512 is BlockTransposes()' to say (interleaved.cc).
#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define BATCHPART_FIXED_SIZE 1
// A size's kernel, compiled for AVX-512.
#define BATCHPART_AVX512 __attribute__((target("avx512f")))
// A step, inlined into each size's kernel.
#define BATCHPART_STEP __attribute__((always_inline, target("avx512f"))) inline
#endif

namespace batchpart::lapack::interleaved {

// Whether an n x n group has a fixed-size kernel (n <= max_n) that this CPU,
// under SetBlockTransposes' cap, runs.
inline bool HasFixedSizeKernel(int64_t rows, int64_t cols, int max_n) {
  return rows == cols && rows >= 1 && rows <= max_n && BlockTransposes() == Isa::kAvx512;
}

#if BATCHPART_FIXED_SIZE

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

// The lanes' correctly rounded square roots (as std::sqrt's, one
// instruction).
template <typename V>
BATCHPART_STEP V Sqrt(const V& v) {
  if constexpr (sizeof(v[0]) == 4) {
    return (V)_mm512_sqrt_ps((__m512)v);  // NOLINT: GNU vector casts
  } else {
    return (V)_mm512_sqrt_pd((__m512d)v);  // NOLINT: GNU vector casts
  }
}

// Writes lane values (small whole numbers, as the kernels keep info) to W
// int32s.
template <typename T>
BATCHPART_STEP void StoreLaneInts(const Vec<T>& v, int32_t* out) {
  alignas(64) Real<T> lanes[kLanes<T>];
  StoreLanes(lanes, v);
  _Pragma("GCC ivdep") for (int l = 0; l < kLanes<T>; ++l) {
    out[l] = static_cast<int32_t>(lanes[l]);
  }
}

// Rows 0..N-1 of column c of an interleaved real matrix, as lane vectors
// (a solve's right-hand side, held in registers), and back.
template <typename T, int N>
BATCHPART_STEP void LoadColumn(const Planes<T>& x, int64_t c, Vec<T> (&v)[N]) {
#pragma GCC unroll 64
  for (int i = 0; i < N; ++i) v[i] = LoadLanes(x.Re(i, c));
}
template <typename T, int N>
BATCHPART_STEP void StoreColumn(const Planes<T>& x, int64_t c, const Vec<T> (&v)[N]) {
#pragma GCC unroll 64
  for (int i = 0; i < N; ++i) StoreLanes(x.Re(i, c), v[i]);
}

#endif  // BATCHPART_FIXED_SIZE

}  // namespace batchpart::lapack::interleaved

#endif  // BATCHPART_LAPACK_FIXED_SIZE_H_
