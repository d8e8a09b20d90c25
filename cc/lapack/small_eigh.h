// Hermitian eigendecomposition of many small matrices at once, on the
// batch-interleaved layout (interleaved.h): the eigh kernel's path for
// batches of matrices small enough that syevd's per-call cost (workspace
// logic, a tridiagonal reduction built for large n, a divide and conquer
// that falls back to QL iteration below 25) dominates.
//
// The algorithm is the cyclic Jacobi method, lane by lane: each lane's
// matrix is scaled by a power of two (exact) so that its largest element
// lies in [1, 2), then rotated, every pair (p, q) once a sweep in rounds of
// disjoint pairs, until a whole sweep finds no off-diagonal element above
// eps * ||A||_F / n (the off-diagonal part is then below eps * ||A||_F, as
// in a backward-stable eigensolver). A pair is skipped where no lane's
// element is above that threshold, so late sweeps cost little. Eigenvalues
// come out ascending, eigenvectors in the same order; a lane with a
// non-finite element in the triangle read gets NaN and kNonFiniteInfo, and
// a lane not converged after kMaxEighSweeps sweeps NaN and info 1.
//
// A complex rotation takes the phase of a(q, p) into a real one:
// U = [[c, conj(g)], [-g, c]] with g = s e, e = a(q, p) / |a(q, p)|, and
// the diagonal's imaginary parts are ignored, as LAPACK's heevd does.
#ifndef BATCHPART_LAPACK_SMALL_EIGH_H_
#define BATCHPART_LAPACK_SMALL_EIGH_H_

#include <cstdint>
#include <vector>

#include "lapack/interleaved.h"

namespace batchpart::lapack::interleaved {

// The sizes n the eigh kernel runs interleaved; above, syevd/heevd per
// matrix is faster. Measured through bp.linalg.eigh (eigenvalues and
// vectors) on one CPU device, single-threaded, random Hermitian matrices;
// AMD EPYC with AVX-512, shared, so +-20%; microseconds per matrix, LAPACK
// -> interleaved:
//          n=2        4          8          16         24        28        32        48
//   f64  0.29->0.06 1.6->0.21 5.4->1.2   20->8.5   46->27    59->45    75->77    177->222
//   f32  0.30->0.06 1.4->0.16 4.6->0.65  17->3.6   39->12    48->19    63->32    136->107
//   c128 0.70->0.07 2.4->0.35 8.4->2.0   34->15    89->53    82->81    105->177  258->482
//   c64  0.74->0.07 2.2->0.23 6.9->1.1   28->8.2   73->25    66->38    86->81    191->233
// Jacobi's work, about 8 sweeps of n^2 / 2 rotations of 4n elements each,
// grows faster than LAPACK's fixed cost shrinks in proportion.
//
// A lone matrix takes a whole group's work (it has no one-matrix twin: a
// matrix's Jacobi rotations vectorize only across matrices), and a matrix
// must take the same path in any batch, so the sizes stop where one matrix
// alone is still about as fast as syevd. Through bp.linalg.eigh on one
// device (jax's dispatch included), a batch of one, syevd -> interleaved,
// us (benchmarks/small_batches.py):
//          n=4        6          8          10         12         16
//   f32  10.6->9.9  11.8->12.1 13.7->14.8 16.2->19.4 17.7->25.2 25.2->65.6
//   f64  11.1->9.8  12.7->12.6 14.8->16.6 16.7->21.5 20.1->33.8 27.9->60.4
//   c64  12.3->10.9 14.2->15.1 16.8->21.7 20.1->34.1 23.3->49.9 35.9->118
//   c128 12.7->10.9 14.5->15.8 18.2->23.8 22.9->38.4 25.3->56.5 41.7->136
// So n <= 8 for the real types (at most 1.13x) and n <= 6 for complex
// (1.09x); the larger sizes the table above shows faster in full groups
// take syevd/heevd in every batch.
template <typename T>
inline constexpr SizeRange kEighSizes = {1, kIsComplex<T> ? 6 : 8};

// Quadratic convergence takes a random matrix of these sizes to the
// threshold in under ten sweeps; a lane still above it after this many is a
// failure, not a slow lane.
inline constexpr int kMaxEighSweeps = 60;

// What EighGroup reuses from one group to the next: V transposed (a
// rotation of (p, q) updates V's columns p and q, rows of vt), one round's
// rotations (cosines and sines, and their pairs), and one lane's
// eigenvalues and their order.
template <typename T>
struct EighWork {
  EighWork(int64_t n, bool vectors)
      : vt(vectors ? n : 0, vectors ? n : 0),
        rotations(3 * n * kLanes<T>),  // c and g (re, im) of up to n / 2 pairs
        pairs(2 * n),
        values(n),
        order(n) {}
  Group<T> vt;
  std::vector<Real<T>> rotations;
  std::vector<int64_t> pairs;
  std::vector<Real<T>> values;
  std::vector<int64_t> order;
};

// Decomposes the kLanes<T> Hermitian matrices of `a` (n x n; the lower
// triangle read when `lower`, else the upper; destroyed). Writes the
// eigenvalues, ascending, to w (1 x n), the eigenvectors as the columns of
// v (n x n) when `vectors` (then `work` was made with vectors too), and each
// lane's info (0, kNonFiniteInfo, or 1 for no convergence) to
// info[0..kLanes<T>). Instantiated for float, double, complex<float> and
// complex<double>.
template <typename T>
void EighGroup(Group<T>& a, bool lower, bool vectors, EighWork<T>& work, Group<Real<T>>& w,
               Group<T>& v, int32_t* info);

// Whether n x n matrices take the interleaved eigh, as
// GetSmallPath(SmallKernel::kEigh) has it: by size alone, so that a matrix
// gets the same bits in any batch (a lone matrix in a padded group).
template <typename T>
bool UseSmallEigh(int64_t n) {
  return n >= 1 && UseSmallPath(SmallKernel::kEigh, kEighSizes<T>.contains(n));
}

}  // namespace batchpart::lapack::interleaved

#endif  // BATCHPART_LAPACK_SMALL_EIGH_H_
