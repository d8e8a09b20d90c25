// The batchpart._cuda extension: the CUDA kernels' handler capsules for
// jax.ffi.register_ffi_target(..., platform="CUDA"). Importing it loads
// cuSOLVER and cuBLAS but does not initialize CUDA; nothing here touches a
// device.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cusolver_common.h>
#include <nanobind/nanobind.h>

#include "cusolver/kernels.h"

namespace nb = nanobind;

#ifndef BATCHPART_CUDA_ARCHITECTURES
#define BATCHPART_CUDA_ARCHITECTURES ""
#endif

NB_MODULE(_cuda, m) {
  m.doc() = "batchpart's CUDA kernels: typed XLA FFI handlers over cuSOLVER and cuBLAS.";
  m.def(
      "handlers",
      [] {
        nb::dict out;
        for (const auto& [name, fn] : batchpart::cusolver::Handlers()) {
          out[name.c_str()] = nb::capsule(fn);
        }
        return out;
      },
      "{target name: XLA FFI handler capsule}, the names of batchpart._core.lapack.handlers()");
  // What the module was compiled against (headers, not the loaded libraries).
  m.attr("cuda_runtime_version") = CUDART_VERSION;
  m.attr("cusolver_version") = CUSOLVER_VERSION;
  m.attr("cublas_version") = CUBLAS_VERSION;
  m.attr("cuda_architectures") = BATCHPART_CUDA_ARCHITECTURES;
}
