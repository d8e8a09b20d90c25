// Test kernels: XLA FFI handlers exposed to Python as PyCapsules.
#ifndef BATCHPART_TESTING_TEST_KERNELS_H_
#define BATCHPART_TESTING_TEST_KERNELS_H_

#include <cstdint>

#include "common/handler_table.h"
#include "xla/ffi/api/ffi.h"

namespace batchpart::testing {

// (short name, XLA_FFI_Handler*) for each test kernel.
HandlerTable Handlers();
// The same for the kernels whose results combine by a named combiner
// (combine_kernels.cc); Handlers() includes them.
HandlerTable CombineHandlers();
// The same for the kernels local along their core dims (halo_kernels.cc);
// Handlers() includes them.
HandlerTable HaloHandlers();
// The same for the kernels that carry a state along a dim (scan_kernels.cc);
// Handlers() includes them.
HandlerTable ScanHandlers();
// The same for the kernel that reads every array through declared roles
// (layout_kernels.cc); Handlers() includes it.
HandlerTable LayoutHandlers();

// Batch elements processed by all test kernels in this process.
int64_t BatchElementsProcessed();
void ResetBatchElementsProcessed();
// The sum of the values the `count` kernel has seen (reset with the counter).
double CountedSum();

// The state of the `stateful` kernel's bundle, an FFI type registered from
// Python under the name "batchpart_test_stateful_offset".
struct StatefulOffset {
  static xla::ffi::TypeId id;
  static const XLA_FFI_TypeInfo info;
  float offset;
};

}  // namespace batchpart::testing

#endif  // BATCHPART_TESTING_TEST_KERNELS_H_
