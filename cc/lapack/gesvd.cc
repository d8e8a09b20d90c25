// batchpart_gesvd: batched SVD by QR iteration (gesvd), the contract of
// batchpart_svd (option_kernels.h). Slower than gesdd on large matrices, but
// jax and scipy offer it (SvdAlgorithm.QR, lapack_driver="gesvd") for its
// accuracy on small singular values and its smaller workspace.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "lapack/batch_loop.h"
#include "lapack/kernel_helpers.h"
#include "lapack/kernel_steps.h"
#include "lapack/option_kernels.h"

namespace batchpart::lapack {
namespace {

constexpr char kTarget[] = "batchpart_gesvd";

struct GesvdShape {
  Dims batch;
  int64_t m, n, k;
  int64_t u_cols;   // m (full), k (reduced) or 0
  int64_t vt_rows;  // n (full), k (reduced) or 0
  char job;         // gesvd's jobu = jobvt: 'A', 'S' or 'N'
};

ffi::Error Validate(const ffi::AnyBuffer& a, const ffi::AnyBuffer& s, const ffi::AnyBuffer& u,
                    const ffi::AnyBuffer& vt, const ffi::AnyBuffer& info, bool full_matrices,
                    bool compute_uv, GesvdShape& shape) {
  BATCHPART_RETURN_IF_ERROR(ExpectLinalgDtype(kTarget, a.element_type()));
  BATCHPART_RETURN_IF_ERROR(ExpectMatrix(kTarget, "operand a", a.dimensions()));
  const Dims dims = a.dimensions();
  shape.batch = BatchDims(dims, 2);
  shape.m = dims[dims.size() - 2];
  shape.n = dims.back();
  shape.k = std::min(shape.m, shape.n);
  shape.job = !compute_uv ? 'N' : full_matrices ? 'A' : 'S';
  shape.u_cols = !compute_uv ? 0 : full_matrices ? shape.m : shape.k;
  shape.vt_rows = !compute_uv ? 0 : full_matrices ? shape.n : shape.k;
  BATCHPART_RETURN_IF_ERROR(ExpectLapackInt(kTarget, "m", shape.m));
  BATCHPART_RETURN_IF_ERROR(ExpectLapackInt(kTarget, "n", shape.n));
  const ffi::DataType dtype = a.element_type();
  BATCHPART_RETURN_IF_ERROR(
      ExpectBuffer(kTarget, "result s", s, WithCore(shape.batch, {shape.k}), RealDtype(dtype)));
  BATCHPART_RETURN_IF_ERROR(
      ExpectBuffer(kTarget, "result u", u, WithCore(shape.batch, {shape.m, shape.u_cols}), dtype));
  BATCHPART_RETURN_IF_ERROR(ExpectBuffer(kTarget, "result vt", vt,
                                         WithCore(shape.batch, {shape.vt_rows, shape.n}), dtype));
  return ExpectBuffer(kTarget, "result info", info, WithCore(shape.batch, {}), ffi::DataType::S32);
}

// The complex gesvd's real workspace, which LAPACK does not query.
int64_t RealWorkspaceSize(const GesvdShape& s) { return std::max<int64_t>(1, 5 * s.k); }

template <typename T>
int32_t CallGesvd(const GesvdShape& shape, T* a, Real<T>* s, T* u, T* vt, T* work, lapack_int lwork,
                  Real<T>* rwork) {
  char jobu = shape.job, jobvt = shape.job;
  lapack_int m = static_cast<lapack_int>(shape.m), n = static_cast<lapack_int>(shape.n);
  lapack_int lda = LeadingDim(shape.m), ldu = LeadingDim(shape.m);
  lapack_int ldvt = LeadingDim(shape.vt_rows), info = 0;
  if constexpr (kIsComplex<T>) {
    Lapack<T>::gesvd(&jobu, &jobvt, &m, &n, a, &lda, s, u, &ldu, vt, &ldvt, work, &lwork, rwork,
                     &info);
  } else {
    Lapack<T>::gesvd(&jobu, &jobvt, &m, &n, a, &lda, s, u, &ldu, vt, &ldvt, work, &lwork, &info);
  }
  return info;
}

template <typename T>
struct GesvdScratch {
  GesvdScratch(const GesvdShape& shape, int64_t lwork)
      : a(shape.m * shape.n), work(lwork), rwork(kIsComplex<T> ? RealWorkspaceSize(shape) : 0) {}
  std::vector<T> a;  // gesvd destroys its input
  std::vector<T> work;
  std::vector<Real<T>> rwork;
  T unused_uv{};  // stands in for U and Vt when job = 'N' (never read)
};

template <typename T>
ffi::Error Decompose(ffi::ThreadPool& pool, const GesvdShape& shape, const ffi::AnyBuffer& a,
                     ffi::AnyBuffer& s, ffi::AnyBuffer& u, ffi::AnyBuffer& vt,
                     ffi::AnyBuffer& info) {
  const int64_t batch = Product(shape.batch);
  if (batch == 0) return ffi::Error::Success();
  int64_t lwork = 1;
  if (shape.k) {
    T size{};
    Real<T> rwork{};
    CallGesvd<T>(shape, nullptr, nullptr, nullptr, nullptr, &size, -1, &rwork);
    lwork = QueriedSize(size);
  }
  BATCHPART_RETURN_IF_ERROR(ExpectLapackInt(kTarget, "workspace size", lwork));
  const double flops =
      kFlopScale<T> * (shape.job == 'N' ? 4.0 : 22.0) * shape.m * shape.n * shape.k;
  return DecomposeEachSvd<T, GesvdScratch<T>>(
      pool, shape, lwork, flops, shape.job != 'N', a, s, u, vt, info,
      [&](GesvdScratch<T>& scratch, Real<T>* sb, T* ub, T* vtb) {
        return CallGesvd<T>(shape, scratch.a.data(), sb, ub, vtb, scratch.work.data(),
                            static_cast<lapack_int>(scratch.work.size()), scratch.rwork.data());
      });
}

ffi::Error GesvdImpl(ffi::ThreadPool pool, ffi::AnyBuffer a, ffi::Result<ffi::AnyBuffer> s,
                     ffi::Result<ffi::AnyBuffer> u, ffi::Result<ffi::AnyBuffer> vt,
                     ffi::Result<ffi::AnyBuffer> info, bool full_matrices, bool compute_uv) {
  BATCHPART_RETURN_IF_ERROR(CheckInitialized(kTarget));
  GesvdShape shape;
  BATCHPART_RETURN_IF_ERROR(Validate(a, *s, *u, *vt, *info, full_matrices, compute_uv, shape));
  return DispatchByDtype(kTarget, a.element_type(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    return Decompose<T>(pool, shape, a, *s, *u, *vt, *info);
  });
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(BatchpartGesvd, GesvdImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()  // a
                                  .Ret<ffi::AnyBuffer>()  // s
                                  .Ret<ffi::AnyBuffer>()  // u
                                  .Ret<ffi::AnyBuffer>()  // vt
                                  .Ret<ffi::AnyBuffer>()  // info
                                  .Attr<bool>("full_matrices")
                                  .Attr<bool>("compute_uv"));

}  // namespace batchpart::lapack
