// Test kernels that are local along their core dims (halo={"n": ...}):
// each result element depends on the operand elements within a window
// around it and on the kernel's own boundary rule at the array's ends.
//
// Each takes any leading batch dims, float32 or float64 (row_stencil int32
// too), checks its buffers' shapes and returns an FFI error, never aborts.
// Every result element is one sum in a fixed order, so a call on a window
// computes, for the elements it keeps, exactly the bits the call on the
// whole array does.
#include <cstdint>
#include <string>

#include "common/dims_string.h"
#include "testing/kernel_checks.h"
#include "testing/test_kernels.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace batchpart::testing {
namespace {

// Boundary rules, scipy.ndimage's names: 0 zero (constant 0), 1 reflect
// (d c b a | a b c d | d c b a), 2 nearest (a a a a | a b c d | d d d d),
// 3 wrap (a b c d | a b c d | a b c d).
enum Mode : int64_t { kZero = 0, kReflect = 1, kNearest = 2, kWrap = 3 };

// The index `i` maps to under `mode` in [0, n), or -1 for a zero.
int64_t Bound(int64_t i, int64_t n, int64_t mode) {
  if (i >= 0 && i < n) return i;
  switch (mode) {
    case kZero:
      return -1;
    case kNearest:
      return i < 0 ? 0 : n - 1;
    case kWrap:
      return ((i % n) + n) % n;
    default: {  // reflect: period 2n, the second half mirrored
      const int64_t j = ((i % (2 * n)) + 2 * n) % (2 * n);
      return j < n ? j : 2 * n - 1 - j;
    }
  }
}

// ---- stencil: (n) -> (n) or (n,m) -> (n,m) ---------------------------------
// y[i] = sum over a in [-lo, hi] of (1 + (a + lo)) * x[i + a] (and over b
// alike for a second dim, weight (1 + (a + lo) + 3 (b + lo))), the weights
// asymmetric so that a window off by one shows. Attributes: rank (1 or 2:
// the trailing dims it runs over), lo, hi (>= 0) and mode (Mode).

template <typename T>
void Stencil(const T* x, T* y, int64_t batch, int64_t n, int64_t m, int64_t lo, int64_t hi,
             int64_t mode, bool two_d) {
  const int64_t blo = two_d ? lo : 0, bhi = two_d ? hi : 0;
  for (int64_t e = 0; e < batch; ++e) {
    const T* xe = x + e * n * m;
    T* ye = y + e * n * m;
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < m; ++j) {
        T sum = 0;
        for (int64_t a = -lo; a <= hi; ++a) {
          const int64_t ii = Bound(i + a, n, mode);
          for (int64_t b = -blo; b <= bhi; ++b) {
            const int64_t jj = two_d ? Bound(j + b, m, mode) : j;
            const T w = static_cast<T>(1 + (a + lo) + 3 * (b + blo));
            sum += (ii < 0 || jj < 0) ? T(0) : w * xe[ii * m + jj];
          }
        }
        ye[i * m + j] = sum;
      }
    }
  }
}

ffi::Error StencilImpl(ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y, int64_t rank,
                       int64_t lo, int64_t hi, int64_t mode) {
  const auto xd = x.dimensions(), yd = y->dimensions();
  if (rank != 1 && rank != 2) return KernelError("stencil", "rank must be 1 or 2");
  if (lo < 0 || hi < 0 || mode < kZero || mode > kWrap) {
    return KernelError("stencil", "lo, hi must be >= 0 and mode in 0..3");
  }
  if (xd.size() < static_cast<size_t>(rank) || xd.size() != yd.size()) {
    return KernelError("stencil", "x and y must have one shape of rank >= " +
                                      std::to_string(rank) + "; got " + DimsToString(xd) + ", " +
                                      DimsToString(yd));
  }
  if (!SameDims(xd, yd)) return KernelError("stencil", "x and y must have one shape");
  const size_t r = xd.size();
  const int64_t n = rank == 2 ? xd[r - 2] : xd[r - 1], m = rank == 2 ? xd[r - 1] : 1;
  const int64_t batch = Product(xd, 0, r - rank);
  if (n == 0 || m == 0 || batch == 0) return ffi::Error::Success();
  if (x.element_type() != y->element_type()) {
    return KernelError("stencil", "y must have x's dtype");
  }
  switch (x.element_type()) {
    case ffi::F32:
      Stencil(x.typed_data<float>(), y->typed_data<float>(), batch, n, m, lo, hi, mode,
              rank == 2);
      break;
    case ffi::F64:
      Stencil(x.typed_data<double>(), y->typed_data<double>(), batch, n, m, lo, hi, mode,
              rank == 2);
      break;
    default:
      return KernelError("stencil", "x must be float32 or float64");
  }
  return ffi::Error::Success();
}

// ---- laplacian: (n,m) -> (n,m) ---------------------------------------------
// The 5-point Laplacian with zero (Dirichlet) boundaries:
// y[i,j] = x[i-1,j] + x[i+1,j] + x[i,j-1] + x[i,j+1] - 4 x[i,j].

template <typename T>
void Laplacian(const T* x, T* y, int64_t batch, int64_t n, int64_t m) {
  for (int64_t e = 0; e < batch; ++e) {
    const T* xe = x + e * n * m;
    T* ye = y + e * n * m;
    for (int64_t i = 0; i < n; ++i) {
      const T* row = xe + i * m;
      const T* up = i > 0 ? row - m : nullptr;
      const T* down = i + 1 < n ? row + m : nullptr;
      for (int64_t j = 0; j < m; ++j) {
        const T north = up ? up[j] : T(0), south = down ? down[j] : T(0);
        const T west = j > 0 ? row[j - 1] : T(0), east = j + 1 < m ? row[j + 1] : T(0);
        ye[i * m + j] = ((north + south) + (west + east)) - T(4) * row[j];
      }
    }
  }
}

ffi::Error LaplacianImpl(ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y) {
  const auto xd = x.dimensions(), yd = y->dimensions();
  if (xd.size() < 2 || xd.size() != yd.size()) {
    return KernelError("laplacian", "x and y must have one shape (...,n,m); got " +
                                        DimsToString(xd) + ", " + DimsToString(yd));
  }
  if (!SameDims(xd, yd)) return KernelError("laplacian", "x and y must have one shape");
  const size_t r = xd.size();
  const int64_t batch = Product(xd, 0, r - 2);
  if (x.element_type() != y->element_type()) {
    return KernelError("laplacian", "y must have x's dtype");
  }
  switch (x.element_type()) {
    case ffi::F32:
      Laplacian(x.typed_data<float>(), y->typed_data<float>(), batch, xd[r - 2], xd[r - 1]);
      break;
    case ffi::F64:
      Laplacian(x.typed_data<double>(), y->typed_data<double>(), batch, xd[r - 2], xd[r - 1]);
      break;
    default:
      return KernelError("laplacian", "x must be float32 or float64");
  }
  return ffi::Error::Success();
}

// ---- row_stencil: (n,m) -> (n) ----------------------------------------------
// y[i] = sum over a in [-lo, hi] of (1 + (a + lo)) * s[i + a], s[i] the sum
// of row i over m, outside the rows by the boundary rule: local along n and
// linear in x, so the sums over parts of m add up to the whole call's
// (halo={"n": Halo(lo, hi)} with reduce={"m": "sum"}). f32, f64, s32 (exact).

template <typename T>
void RowStencil(const T* x, T* y, int64_t batch, int64_t n, int64_t m, int64_t lo,
                int64_t hi, int64_t mode) {
  for (int64_t e = 0; e < batch; ++e) {
    const T* xe = x + e * n * m;
    for (int64_t i = 0; i < n; ++i) {
      T sum = 0;
      for (int64_t a = -lo; a <= hi; ++a) {
        const int64_t ii = Bound(i + a, n, mode);
        if (ii < 0) continue;
        T row = 0;
        for (int64_t j = 0; j < m; ++j) row += xe[ii * m + j];
        sum += static_cast<T>(1 + (a + lo)) * row;
      }
      y[e * n + i] = sum;
    }
  }
}

ffi::Error RowStencilImpl(ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y, int64_t lo,
                          int64_t hi, int64_t mode) {
  const auto xd = x.dimensions(), yd = y->dimensions();
  if (lo < 0 || hi < 0 || mode < kZero || mode > kWrap) {
    return KernelError("row_stencil", "lo, hi must be >= 0 and mode in 0..3");
  }
  if (xd.size() < 2 || yd.size() + 1 != xd.size()) {
    return KernelError("row_stencil", "x must be (...,n,m) and y (...,n); got " +
                                          DimsToString(xd) + ", " + DimsToString(yd));
  }
  for (size_t i = 0; i < yd.size(); ++i) {
    if (xd[i] != yd[i]) return KernelError("row_stencil", "y must be x's shape less m");
  }
  const size_t r = xd.size();
  const int64_t n = xd[r - 2], m = xd[r - 1];
  const int64_t batch = Product(xd, 0, r - 2);
  if (x.element_type() != y->element_type()) {
    return KernelError("row_stencil", "y must have x's dtype");
  }
  switch (x.element_type()) {
    case ffi::F32:
      RowStencil(x.typed_data<float>(), y->typed_data<float>(), batch, n, m, lo, hi, mode);
      break;
    case ffi::F64:
      RowStencil(x.typed_data<double>(), y->typed_data<double>(), batch, n, m, lo, hi, mode);
      break;
    case ffi::S32:
      RowStencil(x.typed_data<int32_t>(), y->typed_data<int32_t>(), batch, n, m, lo, hi,
                 mode);
      break;
    default:
      return KernelError("row_stencil", "x must be float32, float64 or int32");
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(kStencil, StencilImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("rank")
                                  .Attr<int64_t>("lo")
                                  .Attr<int64_t>("hi")
                                  .Attr<int64_t>("mode"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(kLaplacian, LaplacianImpl,
                              ffi::Ffi::Bind().Arg<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(kRowStencil, RowStencilImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("lo")
                                  .Attr<int64_t>("hi")
                                  .Attr<int64_t>("mode"));

HandlerTable HaloHandlers() {
  return {
      {"stencil", reinterpret_cast<void*>(kStencil)},
      {"laplacian", reinterpret_cast<void*>(kLaplacian)},
      {"row_stencil", reinterpret_cast<void*>(kRowStencil)},
  };
}

}  // namespace batchpart::testing
