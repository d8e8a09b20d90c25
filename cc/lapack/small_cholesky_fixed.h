// The interleaved Cholesky factor and solve of small square matrices, one
// kernel per size: FactorLower's (every dtype) and SolveLower's (real
// types) for n <= kMaxFixedCholesky<T> on CPUs with AVX-512 (small_cholesky.h).
//
// At such sizes the run-time-n kernel is mostly overhead: loop bounds and
// lane loops per column, the diagonal and failure test written back and
// read again, and a second pass over the group that zeros the upper
// triangle and fills failed lanes with NaN. With n a constant the factor
// keeps the lower triangle in lane vectors the compiler holds in registers
// as far as they go, tracks failures as lane values, and writes each
// element once, zero or NaN included.
#ifndef BATCHPART_LAPACK_SMALL_CHOLESKY_FIXED_H_
#define BATCHPART_LAPACK_SMALL_CHOLESKY_FIXED_H_

#include <cstdint>

#include "lapack/interleaved.h"

namespace batchpart::lapack::interleaved {

// The largest n with a kernel of its own (measurements in
// small_cholesky_fixed.cc): 16 for the real types; 14 for the complex ones,
// whose two planes at n = 16 made the fixed-size factor no faster.
template <typename T>
inline constexpr int kMaxFixedCholesky = kIsComplex<T> ? 14 : 16;

// Factors the square matrices of `g` (real or complex) as FactorLower
// does, bit for bit (the same values, info and NaN lanes), and returns
// true; or returns false, `g` untouched, where its size has no kernel or
// the CPU (capped by SetBlockTransposes) has no AVX-512.
template <typename T>
bool FactorFixedCholesky(Group<T>& g, bool symmetrize, int32_t* info);

// Solves with a real FactorFixedCholesky factor as SolveLower does, bit for
// bit, and returns true; or returns false, `x` untouched, as
// FactorFixedCholesky would for `factor`.
template <typename T>
bool SolveFixedCholesky(const Group<T>& factor, Group<T>& x);

}  // namespace batchpart::lapack::interleaved

#endif  // BATCHPART_LAPACK_SMALL_CHOLESKY_FIXED_H_
