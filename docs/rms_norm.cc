// rms_norm.cc: y = x / sqrt(mean(x^2) + eps) along the last dim, for every row it is given.
#include <cmath>
#include <cstdint>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

ffi::Error RmsNormImpl(float eps, ffi::Buffer<ffi::F32> x, ffi::ResultBuffer<ffi::F32> y) {
  auto dims = x.dimensions();
  if (dims.size() == 0) return ffi::Error::InvalidArgument("rms_norm: x needs rank >= 1");
  int64_t n = dims.back();
  int64_t rows = n == 0 ? 0 : x.element_count() / n;  // all leading dims: the batch
  const float* in = x.typed_data();
  float* out = y->typed_data();
  for (int64_t r = 0; r < rows; ++r, in += n, out += n) {
    float sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += in[i] * in[i];
    float scale = 1.0f / std::sqrt(sum / n + eps);
    for (int64_t i = 0; i < n; ++i) out[i] = in[i] * scale;
  }
  return ffi::Error::Success();
}

// The symbol jax.ffi.pycapsule wraps: an XLA_FFI_Handler that decodes the call frame.
XLA_FFI_DEFINE_HANDLER_SYMBOL(RmsNorm, RmsNormImpl,
                              ffi::Ffi::Bind()
                                  .Attr<float>("eps")
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
