// Shapes in messages, written as Python writes a tuple: "(2, 3)", "(4,)", "()".
//
// Header-only and free of XLA and Python headers, so that the planner
// (cc/partition/) and the kernels word shapes alike.
#ifndef BATCHPART_COMMON_DIMS_STRING_H_
#define BATCHPART_COMMON_DIMS_STRING_H_

#include <cstddef>
#include <string>

namespace batchpart {

// `dims`: anything with size() and operator[] giving integers (a
// std::vector<int64_t>, an FFI span).
template <typename Dims>
std::string DimsToString(const Dims& dims) {
  std::string out = "(";
  for (size_t i = 0; i < dims.size(); ++i) {
    out += (i ? ", " : "") + std::to_string(dims[i]);
  }
  return out + (dims.size() == 1 ? ",)" : ")");
}

}  // namespace batchpart

#endif  // BATCHPART_COMMON_DIMS_STRING_H_
