// The batchpart._core.lapack submodule: LAPACK initialization from scipy's
// capsules and the kernels' handler capsules.
#ifndef BATCHPART_LAPACK_MODULE_H_
#define BATCHPART_LAPACK_MODULE_H_

#include <nanobind/nanobind.h>

namespace batchpart::lapack {

// Adds the `lapack` submodule to `parent` (batchpart._core).
void DefineLapackSubmodule(nanobind::module_& parent);

}  // namespace batchpart::lapack

#endif  // BATCHPART_LAPACK_MODULE_H_
