// Shape and error helpers shared by the test kernels' source files.
#ifndef BATCHPART_TESTING_KERNEL_CHECKS_H_
#define BATCHPART_TESTING_KERNEL_CHECKS_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "xla/ffi/api/ffi.h"

namespace batchpart::testing {

// An FFI error naming the target the kernel is registered as
// (batchpart/testing), so that Python sees which call it came from.
inline xla::ffi::Error KernelError(const char* kernel, const std::string& message) {
  return xla::ffi::Error::InvalidArgument("batchpart_test_" + std::string(kernel) + ": " +
                                          message);
}

// The product of dims[begin:end] (1 when empty).
inline int64_t Product(xla::ffi::Span<const int64_t> dims, size_t begin, size_t end) {
  int64_t n = 1;
  for (size_t i = begin; i < end; ++i) n *= dims[i];
  return n;
}

inline bool SameDims(xla::ffi::Span<const int64_t> a, xla::ffi::Span<const int64_t> b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
}

}  // namespace batchpart::testing

#endif  // BATCHPART_TESTING_KERNEL_CHECKS_H_
