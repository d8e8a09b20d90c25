// Test kernels: XLA FFI handlers exposed to Python as PyCapsules.
#ifndef BATCHPART_TESTING_TEST_KERNELS_H_
#define BATCHPART_TESTING_TEST_KERNELS_H_

#include <cstdint>

#include "common/handler_table.h"

namespace batchpart::testing {

// (short name, XLA_FFI_Handler*) for each test kernel.
HandlerTable Handlers();

// Batch elements processed by all test kernels in this process.
int64_t BatchElementsProcessed();
void ResetBatchElementsProcessed();

}  // namespace batchpart::testing

#endif  // BATCHPART_TESTING_TEST_KERNELS_H_
