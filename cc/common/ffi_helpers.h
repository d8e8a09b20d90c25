// What the kernels of every platform need around XLA's typed FFI: error
// propagation, messages that name the target, shape and dtype checks, and
// dtype dispatch. Platform code (cc/lapack/, cc/cusolver/) builds on it, so
// a malformed call gets the same message on every platform.
#ifndef BATCHPART_COMMON_FFI_HELPERS_H_
#define BATCHPART_COMMON_FFI_HELPERS_H_

#include <complex>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "common/dims_string.h"
#include "xla/ffi/api/ffi.h"

namespace batchpart {

namespace ffi = xla::ffi;
using Dims = ffi::Span<const int64_t>;

// Returns early from the enclosing function when `expr` is an error.
#define BATCHPART_RETURN_IF_ERROR(expr)                                     \
  do {                                                                      \
    if (::xla::ffi::Error _error = (expr); _error.failure()) return _error; \
  } while (0)

#define BATCHPART_CONCAT_INNER(a, b) a##b
#define BATCHPART_CONCAT(a, b) BATCHPART_CONCAT_INNER(a, b)

// Declares `lhs` from an ffi::ErrorOr<T> expression, or returns its error
// from the enclosing function (which returns ffi::Error).
#define BATCHPART_ASSIGN_OR_RETURN(lhs, expr) \
  BATCHPART_ASSIGN_OR_RETURN_IMPL(BATCHPART_CONCAT(_error_or_, __LINE__), lhs, expr)
#define BATCHPART_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                    \
  if (tmp.has_error()) return std::move(tmp).error();   \
  lhs = std::move(tmp).value()

// ---- messages and checks (ffi_helpers.cc) ----------------------------------

std::string DtypeName(ffi::DataType dtype);

// INVALID_ARGUMENT, "<target>: <message>".
ffi::Error InvalidArgument(const char* target, const std::string& message);

int64_t Product(Dims dims);
// `batch` followed by `core`.
std::vector<int64_t> WithCore(Dims batch, std::initializer_list<int64_t> core);
// The leading rank - `core_rank` dims.
Dims BatchDims(Dims dims, size_t core_rank);

// `what` (e.g. "operand a") has rank >= 2.
ffi::Error ExpectMatrix(const char* target, const char* what, Dims dims);
// `what` has rank >= 2 and equal last two dims.
ffi::Error ExpectSquare(const char* target, const char* what, Dims dims);
ffi::Error ExpectShape(const char* target, const char* what, Dims actual,
                       const std::vector<int64_t>& expected);
ffi::Error ExpectDtype(const char* target, const char* what, ffi::DataType actual,
                       ffi::DataType expected);
// Shape and dtype of a result (or second operand) both match.
ffi::Error ExpectBuffer(const char* target, const char* what, const ffi::AnyBuffer& buffer,
                        const std::vector<int64_t>& shape, ffi::DataType dtype);
// Whether `operand_batch` broadcasts NumPy-style to `out_batch`.
ffi::Error ExpectBroadcast(const char* target, const char* what, Dims operand_batch,
                           Dims out_batch);
// The operand dtype is one of float32, float64, complex64, complex128.
ffi::Error ExpectLinalgDtype(const char* target, ffi::DataType dtype);
// `value` (a matrix dim, a batch or a workspace size) fits the 32-bit
// integers that LAPACK (as scipy exports it), cuSOLVER and cuBLAS take.
ffi::Error ExpectInt32(const char* target, const char* what, int64_t value);
// float32 for complex64, float64 for complex128, else the dtype itself.
ffi::DataType RealDtype(ffi::DataType dtype);

// ---- dtype dispatch ----------------------------------------------------------

template <typename T>
struct TypeTag {
  using type = T;
};

// The C++ scalar types a platform computes in, one per linalg dtype. CPU
// code uses the standard ones; a GPU library substitutes its own complex
// types.
struct StdScalars {
  using F32 = float;
  using F64 = double;
  using C64 = std::complex<float>;
  using C128 = std::complex<double>;
};

// Calls fn(TypeTag<T>{}) with T the `Scalars` type of `dtype`; any other
// dtype is an INVALID_ARGUMENT error.
template <typename Scalars = StdScalars, typename Fn>
ffi::Error DispatchByDtype(const char* target, ffi::DataType dtype, Fn&& fn) {
  switch (dtype) {
    case ffi::DataType::F32:
      return fn(TypeTag<typename Scalars::F32>{});
    case ffi::DataType::F64:
      return fn(TypeTag<typename Scalars::F64>{});
    case ffi::DataType::C64:
      return fn(TypeTag<typename Scalars::C64>{});
    case ffi::DataType::C128:
      return fn(TypeTag<typename Scalars::C128>{});
    default:
      return ExpectLinalgDtype(target, dtype);
  }
}

// Returns fn<T>(args...) from the enclosing handler, T the scalar type that
// DispatchByDtype picks for `dtype` (the one found where the macro is used:
// cusolver's substitutes its complex types), or DispatchByDtype's error
// naming `target`: the typed call each handler of every platform ends with.
#define BATCHPART_RETURN_FOR_DTYPE(target, dtype, fn, ...)          \
  return DispatchByDtype(target, dtype, [&](auto batchpart_tag) {   \
    return fn<typename decltype(batchpart_tag)::type>(__VA_ARGS__); \
  })

}  // namespace batchpart

#endif  // BATCHPART_COMMON_FFI_HELPERS_H_
