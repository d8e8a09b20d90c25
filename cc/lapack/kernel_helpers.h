// Shared pieces of the LAPACK kernels: the initialization check and small
// column-major matrix utilities. Validation, messages and dtype dispatch are
// every platform's (common/ffi_helpers.h, common/contracts.h).
#ifndef BATCHPART_LAPACK_KERNEL_HELPERS_H_
#define BATCHPART_LAPACK_KERNEL_HELPERS_H_

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstdint>
#include <cstring>
#include <limits>
#include <new>
#include <string>
#include <type_traits>
#include <vector>

#include "common/ffi_helpers.h"
#include "lapack/lapack_api.h"

namespace batchpart::lapack {

// ---- initialization (kernel_helpers.cc) -------------------------------------

// The error a kernel returns before batchpart._core.lapack.initialize.
ffi::Error NotInitialized(const char* target);
// Checks initialization; call first in every handler.
ffi::Error CheckInitialized(const char* target);

// `value` (a matrix dim or workspace size) fits LAPACK's 32-bit integers
// (lapack_int); the check is the one every platform uses.
inline ffi::Error ExpectLapackInt(const char* target, const char* what, int64_t value) {
  return ExpectInt32(target, what, value);
}

// ---- aligned scratch ------------------------------------------------------

// Allocates on 64-byte boundaries: a LAPACK routine's bits must not depend
// on where its matrix lies (OpenBLAS's getrf pivots a NaN column differently
// for matrices 4 bytes apart), nor on which chunk's scratch it got.
template <typename T>
struct AlignedAllocator {
  using value_type = T;
  static constexpr std::align_val_t kAlignment{64};
  AlignedAllocator() = default;
  template <typename U>
  AlignedAllocator(const AlignedAllocator<U>&) {}  // NOLINT(google-explicit-constructor)
  T* allocate(std::size_t count) {
    return static_cast<T*>(::operator new(count * sizeof(T), kAlignment));
  }
  void deallocate(T* p, std::size_t) { ::operator delete(p, kAlignment); }
  template <typename U>
  bool operator==(const AlignedAllocator<U>&) const {
    return true;
  }
  template <typename U>
  bool operator!=(const AlignedAllocator<U>&) const {
    return false;
  }
};

// A LAPACK routine's copy of a matrix or its workspace.
template <typename T>
using AlignedVector = std::vector<T, AlignedAllocator<T>>;

// ---- column-major matrix utilities ----------------------------------------

template <typename T>
T NaNValue() {
  const Real<T> nan = std::numeric_limits<Real<T>>::quiet_NaN();
  if constexpr (kIsComplex<T>) {
    return T(nan, nan);
  } else {
    return nan;
  }
}

template <typename T>
void FillNaN(T* data, int64_t count) {
  std::fill_n(data, count, NaNValue<T>());
}

template <typename T>
bool AllFinite(const T* data, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    if constexpr (kIsComplex<T>) {
      if (!std::isfinite(data[i].real()) || !std::isfinite(data[i].imag())) return false;
    } else {
      if (!std::isfinite(data[i])) return false;
    }
  }
  return true;
}

// potrf's info for a factor it returned with info 0: reference LAPACK
// stops at a NaN pivot (info = its 1-based index), but OpenBLAS's potf2
// tests a pivot with `<= 0`, which NaN passes, and goes on. Every later pivot
// depends on a NaN one, so the first NaN on the returned diagonal is where
// reference LAPACK stops; 0 when there is none.
template <typename T>
int32_t FirstNaNPivot(const T* factor, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    if (std::isnan(std::real(factor[j * n + j]))) return static_cast<int32_t>(j + 1);
  }
  return 0;
}

// Copies a rows x cols block between column-major matrices.
template <typename T>
void CopyMatrix(const T* src, int64_t src_ld, T* dst, int64_t dst_ld, int64_t rows, int64_t cols) {
  if (rows == 0) return;
  for (int64_t j = 0; j < cols; ++j) {
    std::memcpy(dst + j * dst_ld, src + j * src_ld, rows * sizeof(T));
  }
}

// Zeroes the strict upper (keep_lower) or strict lower triangle of an n x n
// matrix, which LAPACK leaves holding the input.
template <typename T>
void ZeroOtherTriangle(T* a, int64_t n, bool keep_lower) {
  for (int64_t j = 0; j < n; ++j) {
    if (keep_lower) {
      std::fill_n(a + j * n, j, T(0));
    } else {
      std::fill_n(a + j * n + j + 1, n - j - 1, T(0));
    }
  }
}

// Replaces the lower (or upper) triangle of an n x n column-major matrix by
// that of (A + A^H) / 2: what jax's symmetrize_input computes, here after
// the matrix reached its device, so no transposed copy crosses devices.
template <typename T>
void SymmetrizeTriangle(T* a, int64_t n, bool lower) {
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t i = lower ? j : 0; i < (lower ? n : j + 1); ++i) {
      T& x = a[i + j * n];
      const T& y = a[j + i * n];
      if constexpr (std::is_floating_point_v<T>) {
        x = (x + y) / T(2);
      } else {
        x = (x + std::conj(y)) / typename T::value_type(2);
      }
    }
  }
}

// Zeroes the entries below the diagonal of a rows x cols matrix.
template <typename T>
void ZeroBelowDiagonal(T* a, int64_t rows, int64_t cols) {
  for (int64_t j = 0; j < cols && j + 1 < rows; ++j) {
    std::fill_n(a + j * rows + j + 1, rows - j - 1, T(0));
  }
}

template <typename T>
void FillIdentity(T* a, int64_t rows, int64_t cols) {
  std::fill_n(a, rows * cols, T(0));
  for (int64_t i = 0; i < std::min(rows, cols); ++i) a[i * rows + i] = T(1);
}

// The workspace size a LAPACK query (lwork = -1) wrote into its first work
// element. Single-precision LAPACK reports it as a float, which rounds large
// values; rounding up and adding a little keeps the buffer big enough.
template <typename T>
int64_t QueriedSize(T reported) {
  const double value = static_cast<double>(std::real(reported));
  const double slack = std::is_same_v<Real<T>, float> ? value * 1e-6 : 0.0;
  return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(value + slack)));
}

// Copies `count` elements unless source and destination are one buffer
// (the caller aliased an operand to a result).
template <typename T>
void CopyIfDistinct(const T* src, T* dst, int64_t count) {
  if (src != dst) std::copy_n(src, count, dst);
}

// A complex flop costs about four real ones; the thread-pool cut-off works
// in real flops.
template <typename T>
constexpr double kFlopScale = kIsComplex<T> ? 4.0 : 1.0;

// A leading dimension as LAPACK insists on it (>= 1 even for empty matrices).
inline lapack_int LeadingDim(int64_t rows) {
  return static_cast<lapack_int>(std::max<int64_t>(1, rows));
}

}  // namespace batchpart::lapack

#endif  // BATCHPART_LAPACK_KERNEL_HELPERS_H_
