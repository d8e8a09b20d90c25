// batchpart_posv: batched Hermitian positive-definite solve (potrf + potrs)
// with broadcast batch dims; contract in option_kernels.h.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/batch_broadcast.h"
#include "lapack/batch_loop.h"
#include "lapack/kernel_helpers.h"
#include "lapack/kernel_steps.h"
#include "lapack/option_kernels.h"

namespace batchpart::lapack {
namespace {

constexpr char kTarget[] = "batchpart_posv";

struct PosvShape {
  Dims a_batch, b_batch, x_batch;
  int64_t n, nrhs;
};

ffi::Error Validate(const ffi::AnyBuffer& a, const ffi::AnyBuffer& b, const ffi::AnyBuffer& x,
                    const ffi::AnyBuffer& info, PosvShape& shape) {
  BATCHPART_RETURN_IF_ERROR(ExpectLinalgDtype(kTarget, a.element_type()));
  BATCHPART_RETURN_IF_ERROR(ExpectSquare(kTarget, "operand a", a.dimensions()));
  BATCHPART_RETURN_IF_ERROR(ExpectMatrix(kTarget, "operand b", b.dimensions()));
  BATCHPART_RETURN_IF_ERROR(ExpectMatrix(kTarget, "result x", x.dimensions()));
  const Dims b_dims = b.dimensions();
  shape.n = a.dimensions().back();
  shape.nrhs = b_dims.back();
  shape.a_batch = BatchDims(a.dimensions(), 2);
  shape.b_batch = BatchDims(b_dims, 2);
  shape.x_batch = BatchDims(x.dimensions(), 2);
  if (b_dims[b_dims.size() - 2] != shape.n) {
    return InvalidArgument(kTarget, "operand b of shape " + DimsToString(b_dims) +
                                        " does not fit a of shape " + DimsToString(a.dimensions()) +
                                        " (b's rows must equal a's size)");
  }
  BATCHPART_RETURN_IF_ERROR(ExpectLapackInt(kTarget, "n", shape.n));
  BATCHPART_RETURN_IF_ERROR(ExpectLapackInt(kTarget, "b columns", shape.nrhs));
  BATCHPART_RETURN_IF_ERROR(ExpectDtype(kTarget, "operand b", b.element_type(), a.element_type()));
  BATCHPART_RETURN_IF_ERROR(ExpectBuffer(
      kTarget, "result x", x, WithCore(shape.x_batch, {shape.n, shape.nrhs}), a.element_type()));
  BATCHPART_RETURN_IF_ERROR(
      ExpectBuffer(kTarget, "result info", info, WithCore(shape.x_batch, {}), ffi::DataType::S32));
  BATCHPART_RETURN_IF_ERROR(ExpectBroadcast(kTarget, "operand a", shape.a_batch, shape.x_batch));
  return ExpectBroadcast(kTarget, "operand b", shape.b_batch, shape.x_batch);
}

// A chunk's Cholesky factor of the A it factored last: consecutive batch
// elements that share a broadcast A factor it once.
template <typename T>
struct FactorCache {
  explicit FactorCache(int64_t n) : factor(n * n) {}
  std::vector<T> factor;
  int64_t a_index = -1;
  int32_t info = 0;
};

template <typename T>
void Factor(int64_t n_, char uplo, const T* a, int64_t a_index, FactorCache<T>& cache) {
  if (cache.a_index == a_index) return;
  std::copy_n(a, n_ * n_, cache.factor.data());
  lapack_int n = static_cast<lapack_int>(n_), lda = LeadingDim(n_), info = 0;
  Lapack<T>::potrf(&uplo, &n, cache.factor.data(), &lda, &info);
  cache.a_index = a_index;
  cache.info = info;
}

template <typename T>
ffi::Error Solve(ffi::ThreadPool& pool, const PosvShape& shape, bool lower, const ffi::AnyBuffer& a,
                 const ffi::AnyBuffer& b, ffi::AnyBuffer& x, ffi::AnyBuffer& info) {
  const int64_t n = shape.n;
  char uplo = lower ? 'L' : 'U';
  const double flops = kFlopScale<T> * (n * n * n / 3.0 + 2.0 * n * n * shape.nrhs);
  return SolveEachBatchElement<T, FactorCache<T>>(
      pool, shape, flops, a, b, x, info,
      [&](const T* ai, int64_t a_index, FactorCache<T>& cache) {
        Factor<T>(n, uplo, ai, a_index, cache);
      },
      [&](FactorCache<T>& cache, T* xi, int32_t* info_i) {
        *info_i = cache.info;
        if (cache.info != 0) {
          FillNaN(xi, n * shape.nrhs);
          return;
        }
        lapack_int n_v = static_cast<lapack_int>(n), nrhs = static_cast<lapack_int>(shape.nrhs);
        lapack_int lda = LeadingDim(n), ldb = LeadingDim(n), potrs_info = 0;
        Lapack<T>::potrs(&uplo, &n_v, &nrhs, cache.factor.data(), &lda, xi, &ldb, &potrs_info);
      });
}

ffi::Error PosvImpl(ffi::ThreadPool pool, ffi::AnyBuffer a, ffi::AnyBuffer b,
                    ffi::Result<ffi::AnyBuffer> x, ffi::Result<ffi::AnyBuffer> info, bool lower) {
  BATCHPART_RETURN_IF_ERROR(CheckInitialized(kTarget));
  PosvShape shape;
  BATCHPART_RETURN_IF_ERROR(Validate(a, b, *x, *info, shape));
  return DispatchByDtype(kTarget, a.element_type(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    return Solve<T>(pool, shape, lower, a, b, *x, *info);
  });
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(BatchpartPosv, PosvImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()  // a
                                  .Arg<ffi::AnyBuffer>()  // b
                                  .Ret<ffi::AnyBuffer>()  // x
                                  .Ret<ffi::AnyBuffer>()  // info
                                  .Attr<bool>("lower"));

}  // namespace batchpart::lapack
