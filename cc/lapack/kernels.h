// batchpart's CPU linear-algebra kernels: typed XLA FFI handlers over LAPACK,
// one per target of common/contracts.h (which documents each target's
// operands, results, attributes and conventions). The batch loop may run on
// XLA's intra-op thread pool (batch_loop.h).
#ifndef BATCHPART_LAPACK_KERNELS_H_
#define BATCHPART_LAPACK_KERNELS_H_

#include "common/contracts.h"
#include "common/handler_table.h"
#include "lapack/option_kernels.h"
#include "xla/ffi/api/api.h"

namespace batchpart::lapack {

XLA_FFI_DECLARE_HANDLER_SYMBOL(BatchpartPotrf);
XLA_FFI_DECLARE_HANDLER_SYMBOL(BatchpartGetrf);
XLA_FFI_DECLARE_HANDLER_SYMBOL(BatchpartQr);
XLA_FFI_DECLARE_HANDLER_SYMBOL(BatchpartEigh);
XLA_FFI_DECLARE_HANDLER_SYMBOL(BatchpartSvd);
XLA_FFI_DECLARE_HANDLER_SYMBOL(BatchpartTrsm);
XLA_FFI_DECLARE_HANDLER_SYMBOL(BatchpartGesv);
// CPU-only targets: row-major twins and jax's options (option_kernels.h; no cuSOLVER twin).
XLA_FFI_DECLARE_HANDLER_SYMBOL(BatchpartGetrfRowMajor);
XLA_FFI_DECLARE_HANDLER_SYMBOL(BatchpartGesvRowMajor);
XLA_FFI_DECLARE_HANDLER_SYMBOL(BatchpartTrsmRowMajor);
XLA_FFI_DECLARE_HANDLER_SYMBOL(BatchpartQrRowMajor);
XLA_FFI_DECLARE_HANDLER_SYMBOL(BatchpartGeqrf);
XLA_FFI_DECLARE_HANDLER_SYMBOL(BatchpartGeqp3);
XLA_FFI_DECLARE_HANDLER_SYMBOL(BatchpartGesvd);
XLA_FFI_DECLARE_HANDLER_SYMBOL(BatchpartPosv);

// The CPU registration table: every target this module implements.
inline HandlerTable Handlers() {
  return {
      {kPotrfTarget, reinterpret_cast<void*>(BatchpartPotrf)},
      {kGetrfTarget, reinterpret_cast<void*>(BatchpartGetrf)},
      {kQrTarget, reinterpret_cast<void*>(BatchpartQr)},
      {kEighTarget, reinterpret_cast<void*>(BatchpartEigh)},
      {kSvdTarget, reinterpret_cast<void*>(BatchpartSvd)},
      {kTrsmTarget, reinterpret_cast<void*>(BatchpartTrsm)},
      {kGesvTarget, reinterpret_cast<void*>(BatchpartGesv)},
      {kGetrfRowMajorTarget, reinterpret_cast<void*>(BatchpartGetrfRowMajor)},
      {kGesvRowMajorTarget, reinterpret_cast<void*>(BatchpartGesvRowMajor)},
      {kTrsmRowMajorTarget, reinterpret_cast<void*>(BatchpartTrsmRowMajor)},
      {kQrRowMajorTarget, reinterpret_cast<void*>(BatchpartQrRowMajor)},
      {"batchpart_geqrf", reinterpret_cast<void*>(BatchpartGeqrf)},
      {"batchpart_geqp3", reinterpret_cast<void*>(BatchpartGeqp3)},
      {"batchpart_gesvd", reinterpret_cast<void*>(BatchpartGesvd)},
      {"batchpart_posv", reinterpret_cast<void*>(BatchpartPosv)},
  };
}

}  // namespace batchpart::lapack

#endif  // BATCHPART_LAPACK_KERNELS_H_
