// Cholesky factorization and solve of small matrices, kLanes<T> at a time in
// the batch-interleaved layout (interleaved.h).
//
// The algorithm is LAPACK's unblocked potf2 (left-looking: each column is its
// diagonal's square root, then the column below scaled by its reciprocal),
// with the same failure test (a diagonal that is not > 0, NaN included, fails
// at its 1-based index), run on every lane at once. Lanes are independent:
// one that fails keeps computing garbage that is overwritten with NaN at the
// end, so a failure costs the other lanes nothing.
//
// The kernels read and write the lower triangle of a group. The caller
// factors the upper triangle of A by packing A transposed: the lower triangle
// of A^T is conj(A)'s, whose lower factor M = conj(L) for A = L L^H (the
// diagonals and so the failure index are the same), and unpacking M
// transposed writes M^T = L^H = U.
#ifndef BATCHPART_LAPACK_SMALL_CHOLESKY_H_
#define BATCHPART_LAPACK_SMALL_CHOLESKY_H_

#include <cstdint>

#include "lapack/interleaved.h"

namespace batchpart::lapack::interleaved {

// Whether potrf (UseSmallCholesky) and posv (UseSmallPosv) factor n x n
// matrices with the interleaved algorithm rather than by one LAPACK call
// each (see small_cholesky.cc for the measurements behind the cut-offs), as
// GetSmallPath(SmallKernel::kCholesky) has it.
bool UseSmallCholesky(int64_t n);
bool UseSmallPosv(int64_t n);
// The cut-offs: the largest n of each; the fewest matrices a group takes
// (fewer go one by one to the one-matrix twins, with the same bits).
int64_t SmallCholeskyMaxSize();
int64_t SmallPosvMaxSize();
int64_t SmallCholeskyMinGroup();

// Factors every lane of the square `g` in place: with `symmetrize`, first
// replaces its lower triangle by that of (A + A^H) / 2. Then the lower
// triangle holds L (A = L L^H, real diagonal) and the strict upper triangle
// zeros; info[l] is 0, or potrf's info for a lane that is not positive
// definite, whose every element is then NaN.
template <typename T>
void FactorLower(Group<T>& g, bool symmetrize, int32_t* info);

// Conjugates every element of `g` (nothing for real T): turns the factor of
// a transposed pack into the lower factor of the matrix itself.
template <typename T, int W>
void Conjugate(Group<T, W>& g);

// Overwrites `x` (n x nrhs, holding B) with the solution of L L^H X = B,
// given `factor` from FactorLower with info 0 in every lane it solves.
template <typename T>
void SolveLower(const Group<T>& factor, Group<T>& x);

// The one-matrix twins of FactorLower and SolveLower, for a group too small
// to repay its padding: the same bits, on one matrix held transposed
// (element (j, i) of g is the group's (i, j): pack it with the group's
// strides swapped), and X likewise (x is r x n).
template <typename T>
void FactorLowerOne(Group<T, 1>& g, bool symmetrize, int32_t* info);
template <typename T>
void SolveLowerOne(const Group<T, 1>& factor, Group<T, 1>& x);

}  // namespace batchpart::lapack::interleaved

#endif  // BATCHPART_LAPACK_SMALL_CHOLESKY_H_
