// The batchpart._cuda extension: the CUDA kernels' handler capsules for
// jax.ffi.register_ffi_target(..., platform="CUDA"). Importing it loads
// cuSOLVER and cuBLAS but does not initialize CUDA; nothing here touches a
// device.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cusolver_common.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <stdexcept>
#include <vector>

#include "common/capsules.h"
#include "cusolver/kernels.h"
#include "cusolver/solver_api.h"

namespace nb = nanobind;

#ifndef BATCHPART_CUDA_ARCHITECTURES
#define BATCHPART_CUDA_ARCHITECTURES ""
#endif

NB_MODULE(_cuda, m) {
  m.doc() = "batchpart's CUDA kernels: typed XLA FFI handlers over cuSOLVER and cuBLAS.";
  m.def(
      "handlers", [] { return batchpart::HandlerCapsules(batchpart::cusolver::Handlers()); },
      "{target name: XLA FFI handler capsule}, one per target of the CUDA registration table");
  // For tests (no GPU needed): the operand batch element that feeds each
  // output batch element, as the device kernels compute it from the merged
  // map that MakeBroadcastIndex builds.
  m.def(
      "_broadcast_map",
      [](const std::vector<int64_t>& out_batch, const std::vector<int64_t>& in_batch) {
        const batchpart::Dims out_dims(out_batch), in_dims(in_batch);
        batchpart::cusolver::BroadcastIndex index;
        xla::ffi::Error error =
            batchpart::ExpectBroadcast("_broadcast_map", "operand", in_dims, out_dims);
        if (error.success()) {
          error = batchpart::cusolver::MakeBroadcastIndex("_broadcast_map", "operand", out_dims,
                                                          in_dims, &index);
        }
        if (error.failure()) throw std::invalid_argument(error.message());
        int64_t count = 1;
        for (int64_t d : out_batch) count *= d;
        std::vector<int64_t> out(count);
        for (int64_t i = 0; i < count; ++i) out[i] = index(i);
        return std::make_pair(index.rank, out);
      },
      nb::arg("out_batch"), nb::arg("in_batch"));
  // What the module was compiled against (headers, not the loaded libraries).
  m.attr("cuda_runtime_version") = CUDART_VERSION;
  m.attr("cusolver_version") = CUSOLVER_VERSION;
  m.attr("cublas_version") = CUBLAS_VERSION;
  m.attr("cuda_architectures") = BATCHPART_CUDA_ARCHITECTURES;
}
