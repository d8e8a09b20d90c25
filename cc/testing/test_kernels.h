// Test kernels: XLA FFI handlers exposed to Python as PyCapsules.
#ifndef BATCHPART_TESTING_TEST_KERNELS_H_
#define BATCHPART_TESTING_TEST_KERNELS_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace batchpart::testing {

// (short name, XLA_FFI_Handler*) for each test kernel.
std::vector<std::pair<std::string, void*>> Handlers();

// Batch elements processed by all test kernels in this process.
int64_t BatchElementsProcessed();
void ResetBatchElementsProcessed();

}  // namespace batchpart::testing

#endif  // BATCHPART_TESTING_TEST_KERNELS_H_
