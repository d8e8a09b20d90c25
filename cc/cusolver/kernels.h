// batchpart's CUDA linear-algebra kernels: typed XLA FFI handlers over
// cuSOLVER and cuBLAS, registered for platform "CUDA" under the SAME target
// names as the CPU kernels, with the SAME operand/result/attribute contracts
// (common/contracts.h: column-major matrices, leading batch dims, int32
// pivots/info, NaN for failed batch elements, no input makes a call fail).
//
// Every handler takes XLA's CUDA stream (PlatformStream<cudaStream_t>) and
// draws workspace from XLA's allocator (ScratchAllocator); none synchronizes
// the stream. Per target, the routines used:
//
// batchpart_potrf  cusolverDn<t>potrfBatched when there are enough matrices
//                  for their size (batch > 1 and n / batch <= 128), else
//                  <t>potrf per element; a kernel zeroes the other triangle
//                  and NaN-fills failed (or non-finite) factors.
// batchpart_getrf  cublas<t>getrfBatched for square batches that jaxlib
//                  would batch (n / batch <= 128), else cusolverDn<t>getrf
//                  per element; a kernel turns pivots into 0-based pivots
//                  and the permutation.
// batchpart_qr     cusolverDn<t>geqrf then <t>orgqr / <t>ungqr per element.
// batchpart_eigh   cusolverDn<t>syevjBatched / heevjBatched for n <= 32,
//                  else <t>syevd / heevd per element. A matrix whose read
//                  triangle is not finite is zeroed before the solver sees
//                  it, and reported with info = -4 and NaN results.
// batchpart_svd    cusolverDn<t>gesvdjBatched for m, n <= 32, else <t>gesvd
//                  per element (gesvd needs m >= n: a wide matrix is
//                  decomposed as its conjugate transpose, with U and Vt
//                  swapped back). Non-finite input: info = -4, NaN results.
// batchpart_trsm   cublas<t>trsmBatched (cublas<t>trsm for one matrix) on
//                  pointer arrays built on the device; broadcast batch dims
//                  of a and b are mapped, never materialised for a.
// batchpart_gesv   LU of each distinct a (as batchpart_getrf), then
//                  cublas<t>getrsBatched or cusolverDn<t>getrs per right-hand
//                  side; a singular a gives NaN in x and getrf's info.
#ifndef BATCHPART_CUSOLVER_KERNELS_H_
#define BATCHPART_CUSOLVER_KERNELS_H_

#include "common/contracts.h"
#include "common/handler_table.h"
#include "xla/ffi/api/api.h"

namespace batchpart::cusolver {

XLA_FFI_DECLARE_HANDLER_SYMBOL(BatchpartPotrfCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(BatchpartGetrfCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(BatchpartQrCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(BatchpartEighCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(BatchpartSvdCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(BatchpartTrsmCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(BatchpartGesvCuda);

// The CUDA registration table: every target this module implements.
inline HandlerTable Handlers() {
  return {
      {kPotrfTarget, reinterpret_cast<void*>(BatchpartPotrfCuda)},
      {kGetrfTarget, reinterpret_cast<void*>(BatchpartGetrfCuda)},
      {kQrTarget, reinterpret_cast<void*>(BatchpartQrCuda)},
      {kEighTarget, reinterpret_cast<void*>(BatchpartEighCuda)},
      {kSvdTarget, reinterpret_cast<void*>(BatchpartSvdCuda)},
      {kTrsmTarget, reinterpret_cast<void*>(BatchpartTrsmCuda)},
      {kGesvTarget, reinterpret_cast<void*>(BatchpartGesvCuda)},
  };
}

}  // namespace batchpart::cusolver

#endif  // BATCHPART_CUSOLVER_KERNELS_H_
