// LU factorization and general solve of many small matrices at once, on the
// batch-interleaved layout (interleaved.h): getrf's and gesv's kernels for
// batches of matrices small enough that one LAPACK call each costs more in
// fixed overhead than in arithmetic.
//
// The algorithm is getf2's (unblocked, right-looking, partial pivoting) as
// RowMajorLu runs it (lu_steps.h), with every scalar step a loop over the
// group's lanes, so each lane makes the choices LAPACK makes for its own
// matrix: the pivot of largest |re| + |im|, the first of equals; an exactly
// zero pivot column left in place with info = 1 + its index; division
// instead of the reciprocal for a pivot below the smallest normal number.
#ifndef BATCHPART_LAPACK_SMALL_LU_H_
#define BATCHPART_LAPACK_SMALL_LU_H_

#include <cstdint>

#include "lapack/interleaved.h"

namespace batchpart::lapack::interleaved {

// The largest max(m, n) that getrf factors interleaved, and the largest n
// that gesv solves interleaved. Measured single-threaded on AVX-512 (2048
// matrices, microseconds per matrix, today's path -> interleaved):
//   getrf f64 row-major: n=2 0.08 -> 0.03, 8 0.38 -> 0.08, 16 1.4 -> 0.33,
//   32 5.3 -> 2.1, ...
// (see small_lu.cc's SmallLuMaxSize for the table that sets them).
template <typename T>
inline constexpr int64_t kSmallLuMaxSize = 32;
template <typename T>
inline constexpr int64_t kSmallSolveMaxSize = 32;

// Batches smaller than this stay on the per-matrix path: a group padded with
// identities costs a whole group's work.
template <typename T>
inline constexpr int64_t kSmallLuMinBatch = 2;

// Factors the kLanes<T> rows x cols matrices of `g` in place (L unit lower
// below the diagonal, U on and above it). Writes pivot i (0-based) of lane
// l to pivots[i * kLanes<T> + l], i < min(rows, cols), and getrf's info of
// lane l to info[l].
template <typename T>
void FactorGroup(Group<T>& g, int32_t* pivots, int32_t* info);

// Overwrites the n x r matrices of `x` (holding B) with the solutions of
// A X = B, given the n x n `lu` and `pivots` from FactorGroup. Lanes whose
// U is singular get Inf or NaN; the caller replaces them.
template <typename T>
void SolveGroup(const Group<T>& lu, const int32_t* pivots, Group<T>& x);

// Switches the interleaved kernels off (every batch on the per-matrix path)
// or back on; for measurements and for tests that compare both paths.
void SetSmallLuEnabled(bool enabled);
bool SmallLuEnabled();

}  // namespace batchpart::lapack::interleaved

#endif  // BATCHPART_LAPACK_SMALL_LU_H_
