// The interleaved LU of small square real matrices, one kernel per size:
// FactorGroup's (small_lu.h) for n <= kMaxFixedLu on CPUs with AVX-512.
//
// At such sizes FactorLanes' steps are mostly overhead: run-time loop
// bounds, its blocked updates' bookkeeping, and above all its row swaps,
// which each lane makes on its own in scalar loads and stores (random
// 8 x 8 float32, single-threaded: 54 ns a matrix to factor, 27 ns on
// matrices that need no swaps). With n a constant every loop unrolls, a
// step's column stays in registers, and the swap becomes masked blends
// inside the update that loads and stores the trailing columns anyway.
#ifndef BATCHPART_LAPACK_SMALL_LU_FIXED_H_
#define BATCHPART_LAPACK_SMALL_LU_FIXED_H_

#include <cstdint>

#include "lapack/interleaved.h"
#include "lapack/small_lu.h"

namespace batchpart::lapack::interleaved {

// The largest n with a kernel of its own. Measured single-threaded,
// standalone (FactorGroup with whole-row swaps on random matrices, which
// pivot at almost every step; ns per matrix, with a copy of the group;
// FactorLanes -> fixed size; +-10%):
//            n = 4       8        12       13        14        15        16
//   float32    8->2.1 38->12.8  90->34  106->41  122->53   145->61   168->73
//   float64   15->4.4 60->26   127->71  151->89  175->112  205->136  242->168
// From n = 14 or so a step's row masks no longer fit the mask registers;
// each row's two blends sit together so that one reload serves both (apart,
// n = 16 took 240 ns in float64). Larger sizes would still gain (n = 20:
// float32 284 -> 182, float64 416 -> 378), but the code grows as n^3: the
// kernels to 16 are 1.3 MB of machine code, to 20 2.6 MB, and their compile
// time doubles too.
inline constexpr int kMaxFixedLu = 16;

// Factors the square real matrices of `g` as FactorGroup does, bit for bit
// (the same pivots, info and values, zero and tiny pivots included), and
// returns true; or returns false, `g` untouched, where its size has no
// kernel or the CPU (capped by SetBlockTransposes) has no AVX-512.
template <typename T>
bool FactorFixedSize(Group<T>& g, RowSwaps swaps, int32_t* pivots, int32_t* info);

// Solves with a group's FactorFixedSize(RowSwaps::kFromBlock) factors as
// SolveGroup does, bit for bit, and returns true; or returns false, `x`
// untouched, as FactorFixedSize would for `lu`.
template <typename T>
bool SolveFixedSize(const Group<T>& lu, const int32_t* pivots, Group<T>& x);

}  // namespace batchpart::lapack::interleaved

#endif  // BATCHPART_LAPACK_SMALL_LU_FIXED_H_
