// The scalar types every CPU kernel takes, LAPACK's four (s, d, c, z), listed
// once: for the .cc files that instantiate their templates explicitly and for
// code that loops over the types.
#ifndef BATCHPART_LAPACK_SCALAR_TYPES_H_
#define BATCHPART_LAPACK_SCALAR_TYPES_H_

#include <complex>

#include "common/ffi_helpers.h"

// Expands M(T) for T = float, double, std::complex<float> and
// std::complex<double>, in that order; M(T) is one type's explicit
// instantiations.
#define BATCHPART_FOR_EACH_SCALAR(M) \
  M(float)                           \
  M(double)                          \
  M(std::complex<float>)             \
  M(std::complex<double>)

namespace batchpart::lapack {

// Calls fn(TypeTag<T>{}) for each scalar type, in BATCHPART_FOR_EACH_SCALAR's
// order.
template <typename Fn>
void ForEachScalarType(const Fn& fn) {
#define BATCHPART_CALL_FN(T) fn(TypeTag<T>{});
  BATCHPART_FOR_EACH_SCALAR(BATCHPART_CALL_FN)
#undef BATCHPART_CALL_FN
}

}  // namespace batchpart::lapack

#endif  // BATCHPART_LAPACK_SCALAR_TYPES_H_
