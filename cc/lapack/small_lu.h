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

// The sizes (max(m, n) for getrf, n for gesv) each target runs interleaved;
// elsewhere the per-matrix path is faster. Measured single-threaded through
// jax on one CPU device (benchmarks/small_lu.py sweep; AMD EPYC with
// AVX-512, shared and loaded, so +-20%), microseconds per matrix, per-matrix
// path -> interleaved, nrhs = 1:
//                 f32 n=4      8       16      32      48      64
//   getrf row     0.05->0.06 0.17->0.11 0.84->0.63 2.8->3.9  10.7->11.6 17->22
//   getrf col     0.16->0.07 0.57->0.34 1.51->0.88 5.2->4.2  18.7->13.8 20->21
//   gesv row      0.09->0.04 0.44->0.15 1.47->0.57 7.4->3.5  17.6->9.9  31->19
//   gesv col      0.21->0.08 0.56->0.18 1.53->0.58 7.0->5.4  10.0->7.8  18->18
//                 f64 n=4      8       16      32      48      64
//   getrf row     0.07->0.07 0.24->0.25 0.63->0.67 3.0->4.0  8.5->12.4  24->34
//   getrf col     0.14->0.07 0.67->0.38 1.55->1.04 6.4->9.6  13->15     35->75
//   gesv row      0.14->0.08 0.52->0.16 1.34->0.63 5.7->3.5  14.3->10.8 29->29
//   gesv col      0.35->0.11 0.52->0.23 1.78->1.18 5.4->5.0  11.8->13.5 20->33
// (n = 12: getrf row f32 0.54->0.32, f64 0.51->0.31; n = 24: getrf row f32
// 1.66->1.84, f64 1.67->2.14, getrf col f64 3.3->3.0, gesv col f64
// 3.2->2.1.) Complex types take their real type's ranges (their updates
// are 4x the arithmetic on the same packing).
//
// Since packing moves blocks through SIMD transposes (interleaved.cc), the
// row-major getrf, whose per-matrix path RowMajorLu is vectorized along
// rows already, gains too; measured as above, per-matrix -> interleaved,
// on random matrices (pivoting at almost every step) / on diagonally
// dominant ones (almost none):
//                 n=2       4           8           16          24          32          48
//   f32 random    -         0.07->0.04  0.25->0.10  0.79->0.37  1.62->0.94  3.0->2.2    7.1->5.2
//   f32 dominant  0.02 even 0.04->0.03  0.13->0.08  0.57->0.26  1.29->0.67  2.7->1.7    -
//   f64 random    -         0.09->0.05  0.24->0.19  0.95->0.70  1.97->1.54  3.5->3.9    9.3->9.3
//   f64 dominant  0.02->.024 0.064 even 0.20->0.16  0.81->0.66  1.80->1.60  4.0->3.6    -
// With the fixed-size kernels (small_lu_fixed.h) and groups a page apart
// unpacked half at a time (interleaved.cc), the row-major getrf gains at
// both ends too; through bp.linalg.lu on both cores, a batch of about
// 4 MiB, per-matrix path time / interleaved:
//                 n=1    2      3      28     32     48     56     64
//   f32           1.61x  2.25x  2.91x  -      1.62x  1.38x  1.40x  1.07x
//   f64           1.48x  1.89x  2.78x  1.23x  1.09x  -      0.97x  0.95x
//   complex64     0.87x  1.42x  -      -      -      2.78x  2.51x  -
//   complex128    0.87x  1.06x  -      1.52x  1.51x  -      -      -
// (f64 n = 32 read 1.36x in a second run.) So it runs from n = 2 (where
// complex n = 1 loses) to 56 in single precision and 32 in double.
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
