// batchpart_gesvd: batched SVD by QR iteration (gesvd), the contract of
// batchpart_svd (option_kernels.h). Slower than gesdd on large matrices, but
// jax and scipy offer it (SvdAlgorithm.QR, lapack_driver="gesvd") for its
// accuracy on small singular values and its smaller workspace.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/contracts.h"
#include "lapack/batch_loop.h"
#include "lapack/kernel_helpers.h"
#include "lapack/kernel_steps.h"
#include "lapack/option_kernels.h"

namespace batchpart::lapack {
namespace {

// The complex gesvd's real workspace, which LAPACK does not query.
int64_t RealWorkspaceSize(const SvdShape& s) { return std::max<int64_t>(1, 5 * s.k); }

template <typename T>
int32_t CallGesvd(const SvdShape& shape, T* a, Real<T>* s, T* u, T* vt, T* work, lapack_int lwork,
                  Real<T>* rwork) {
  char jobu = SvdJob(shape), jobvt = jobu;
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

// gesvd's workspaces for a chunk of the batch, and the call on its copy of a.
template <typename T>
struct GesvdScratch {
  GesvdScratch(const SvdShape& shape, int64_t lwork)
      : a(shape.m * shape.n), work(lwork), rwork(kIsComplex<T> ? RealWorkspaceSize(shape) : 0) {}
  int32_t Decompose(const SvdShape& shape, Real<T>* s, T* u, T* vt) {
    return CallGesvd<T>(shape, a.data(), s, u, vt, work.data(),
                        static_cast<lapack_int>(work.size()), rwork.data());
  }
  AlignedVector<T> a;  // gesvd destroys its input
  AlignedVector<T> work;
  AlignedVector<Real<T>> rwork;
  T unused_uv{};  // stands in for U and Vt without compute_uv (never read)
};

// gesvd, behind batchpart_gesvd.
struct Gesvd {
  static constexpr const char* kTarget = "batchpart_gesvd";

  template <typename T>
  static ffi::Error Decompose(ffi::ThreadPool& pool, const SvdShape& shape,
                              const ffi::AnyBuffer& a, ffi::AnyBuffer& s, ffi::AnyBuffer& u,
                              ffi::AnyBuffer& vt, ffi::AnyBuffer& info) {
    int64_t lwork = 1;
    if (shape.k) {
      T size{};
      Real<T> rwork{};
      CallGesvd<T>(shape, nullptr, nullptr, nullptr, nullptr, &size, -1, &rwork);
      lwork = QueriedSize(size);
    }
    BATCHPART_RETURN_IF_ERROR(ExpectLapackInt(kTarget, "workspace size", lwork));
    return DecomposeEachSvd<T, GesvdScratch<T>>(pool, shape, lwork, /*uv_flops=*/22.0, a, s, u,
                                                vt, info);
  }
};

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(BatchpartGesvd, SvdHandler<Gesvd>,
                              BindSvd(ffi::Ffi::Bind().Ctx<ffi::ThreadPool>()));

}  // namespace batchpart::lapack
