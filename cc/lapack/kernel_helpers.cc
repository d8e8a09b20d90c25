#include "lapack/kernel_helpers.h"

#include <string>

namespace batchpart::lapack {

ffi::Error NotInitialized(const char* target) {
  return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                    std::string(target) +
                        ": LAPACK is not initialized; call "
                        "batchpart._lapack_targets.register() first");
}

ffi::Error CheckInitialized(const char* target) {
  return LapackInitialized() ? ffi::Error::Success() : NotInitialized(target);
}

}  // namespace batchpart::lapack
