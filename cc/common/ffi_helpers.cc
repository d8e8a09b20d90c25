#include "common/ffi_helpers.h"

#include <algorithm>
#include <limits>
#include <string>

#include "common/batch_broadcast.h"

namespace batchpart {
namespace {

bool SameDims(Dims a, const std::vector<int64_t>& b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
}

}  // namespace

std::string DtypeName(ffi::DataType dtype) {
  switch (dtype) {
    case ffi::DataType::F32:
      return "float32";
    case ffi::DataType::F64:
      return "float64";
    case ffi::DataType::C64:
      return "complex64";
    case ffi::DataType::C128:
      return "complex128";
    case ffi::DataType::S32:
      return "int32";
    default:
      return "dtype #" + std::to_string(static_cast<int>(dtype));
  }
}

ffi::Error InvalidArgument(const char* target, const std::string& message) {
  return ffi::Error::InvalidArgument(std::string(target) + ": " + message);
}

int64_t Product(Dims dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

std::vector<int64_t> WithCore(Dims batch, std::initializer_list<int64_t> core) {
  std::vector<int64_t> out(batch.begin(), batch.end());
  out.insert(out.end(), core.begin(), core.end());
  return out;
}

Dims BatchDims(Dims dims, size_t core_rank) { return dims.first(dims.size() - core_rank); }

ffi::Error ExpectMatrix(const char* target, const char* what, Dims dims) {
  if (dims.size() >= 2) return ffi::Error::Success();
  return InvalidArgument(
      target, std::string(what) + " must have rank >= 2, got shape " + DimsToString(dims));
}

ffi::Error ExpectSquare(const char* target, const char* what, Dims dims) {
  BATCHPART_RETURN_IF_ERROR(ExpectMatrix(target, what, dims));
  if (dims[dims.size() - 2] == dims.back()) return ffi::Error::Success();
  return InvalidArgument(
      target,
      std::string(what) + " must be square in its last two dims, got shape " + DimsToString(dims));
}

ffi::Error ExpectShape(const char* target, const char* what, Dims actual,
                       const std::vector<int64_t>& expected) {
  if (SameDims(actual, expected)) return ffi::Error::Success();
  return InvalidArgument(target, std::string(what) + " has shape " + DimsToString(actual) +
                                     ", expected " + DimsToString(expected));
}

ffi::Error ExpectDtype(const char* target, const char* what, ffi::DataType actual,
                       ffi::DataType expected) {
  if (actual == expected) return ffi::Error::Success();
  return InvalidArgument(target, std::string(what) + " has dtype " + DtypeName(actual) +
                                     ", expected " + DtypeName(expected));
}

ffi::Error ExpectBuffer(const char* target, const char* what, const ffi::AnyBuffer& buffer,
                        const std::vector<int64_t>& shape, ffi::DataType dtype) {
  BATCHPART_RETURN_IF_ERROR(ExpectShape(target, what, buffer.dimensions(), shape));
  return ExpectDtype(target, what, buffer.element_type(), dtype);
}

ffi::Error ExpectBroadcast(const char* target, const char* what, Dims operand_batch,
                           Dims out_batch) {
  if (BatchBroadcast::Broadcasts(out_batch, operand_batch)) return ffi::Error::Success();
  return InvalidArgument(target, std::string("batch dims ") + DimsToString(operand_batch) + " of " +
                                     what + " do not broadcast to the result's batch dims " +
                                     DimsToString(out_batch));
}

ffi::Error ExpectLinalgDtype(const char* target, ffi::DataType dtype) {
  switch (dtype) {
    case ffi::DataType::F32:
    case ffi::DataType::F64:
    case ffi::DataType::C64:
    case ffi::DataType::C128:
      return ffi::Error::Success();
    default:
      return InvalidArgument(target, "unsupported dtype " + DtypeName(dtype) +
                                         " (float32, float64, complex64 or complex128)");
  }
}

ffi::Error ExpectInt32(const char* target, const char* what, int64_t value) {
  if (value <= std::numeric_limits<int32_t>::max()) return ffi::Error::Success();
  return InvalidArgument(target, std::string(what) + " = " + std::to_string(value) +
                                     " exceeds the solvers' 32-bit integer range");
}

ffi::DataType RealDtype(ffi::DataType dtype) {
  switch (dtype) {
    case ffi::DataType::C64:
      return ffi::DataType::F32;
    case ffi::DataType::C128:
      return ffi::DataType::F64;
    default:
      return dtype;
  }
}

}  // namespace batchpart
