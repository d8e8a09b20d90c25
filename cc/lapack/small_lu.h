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

// Sized by max(m, n) for getrf, n for gesv (SizeRange); complex types take
// their real type's ranges.
template <typename T>
inline constexpr SizeRange kGetrfColumnMajorSizes = {1, kSingle<T> ? 32 : 16};
template <typename T>
inline constexpr SizeRange kGetrfRowMajorSizes = kSingle<T> ? SizeRange{2, 56} : SizeRange{2, 32};
template <typename T>
inline constexpr SizeRange kGesvColumnMajorSizes = {1, kSingle<T> ? 48 : 24};
template <typename T>
inline constexpr SizeRange kGesvRowMajorSizes = {1, kSingle<T> ? 64 : 48};

// A group of fewer matrices factors them one by one (FactorOne): a group
// padded with identities costs a whole group's work.
template <typename T>
inline constexpr int64_t kSmallLuMinGroup = 2;

// How far FactorGroup's row swaps reach: whole rows, getrf's LU; or only
// the columns from each step's block of steps on (small_lu.cc), which is
// all SolveGroup needs and saves the rest.
enum class RowSwaps { kWholeRows, kFromBlock };

// FactorGroup's elimination steps per block (small_lu.cc): with
// RowSwaps::kFromBlock, step k's swap reaches the columns from
// k - k % kLuBlockSteps on, and SolveGroup applies it accordingly.
inline constexpr int kLuBlockSteps = 2;

// Factors the kLanes<T> rows x cols matrices of `g` in place (L unit lower
// below the diagonal, U on and above it). Writes pivot i (0-based) of lane
// l to pivots[i * kLanes<T> + l], i < min(rows, cols), and getrf's info of
// lane l to info[l].
template <typename T>
void FactorGroup(Group<T>& g, RowSwaps swaps, int32_t* pivots, int32_t* info);

// The row permutations of a group's factorizations: from the k pivots per
// lane FactorGroup wrote, writes perm[i * kLanes<T> + l] (i < m), the row of
// lane l's matrix that row i of its L U came from (0..m-1 with the pivots'
// swaps applied in order; a pivot outside [i, m) swaps nothing). All lanes
// at once, in SIMD: lane by lane, each swap waited on the one before.
template <typename T>
void PermutationGroup(const int32_t* pivots, int64_t k, int64_t m, int32_t* perm);

// Overwrites the n x r matrices of `x` (holding B) with the solutions of
// A X = B, given the n x n `lu` and `pivots` FactorGroup left with
// RowSwaps::kFromBlock. Lanes whose U is singular get Inf or NaN; the
// caller replaces them.
template <typename T>
void SolveGroup(const Group<T>& lu, const int32_t* pivots, Group<T>& x);

// The one-matrix twins of FactorGroup (whole rows swapped) and SolveGroup,
// for a group too small to repay its padding: the same bits, on one
// row-major matrix (a's element (i, j) is the group's), with 0-based
// pivots; FactorOne returns getrf's info, and SolveOne solves the n x r x
// (holding B) with FactorOne's LU.
template <typename T>
int32_t FactorOne(Group<T, 1>& a, int32_t* pivots);
template <typename T>
void SolveOne(const Group<T, 1>& lu, const int32_t* pivots, Group<T, 1>& x);

// Whether getrf or gesv (sizes: its k*Sizes range above) factors matrices
// of largest dimension n with the interleaved algorithm, as
// GetSmallPath(SmallKernel::kLu) has it: by size alone, so that a matrix
// gets the same bits in any batch.
inline bool UseSmallLu(SizeRange sizes, int64_t n) {
  return n >= 1 && UseSmallPath(SmallKernel::kLu, sizes.contains(n));
}

}  // namespace batchpart::lapack::interleaved

#endif  // BATCHPART_LAPACK_SMALL_LU_H_
