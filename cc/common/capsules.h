// A registration table as Python sees it: {target name: PyCapsule}, the form
// jax.ffi.register_ffi_target takes. Header-only, for the nanobind modules.
#ifndef BATCHPART_COMMON_CAPSULES_H_
#define BATCHPART_COMMON_CAPSULES_H_

#include <nanobind/nanobind.h>

#include "common/handler_table.h"

namespace batchpart {

inline nanobind::dict HandlerCapsules(const HandlerTable& table) {
  nanobind::dict out;
  for (const auto& [name, handler] : table) out[name.c_str()] = nanobind::capsule(handler);
  return out;
}

}  // namespace batchpart

#endif  // BATCHPART_COMMON_CAPSULES_H_
