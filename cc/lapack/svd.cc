// batchpart_svd: batched singular value decomposition (gesdd).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "lapack/batch_loop.h"
#include "lapack/kernel_helpers.h"
#include "lapack/kernel_steps.h"
#include "lapack/kernels.h"

namespace batchpart::lapack {
namespace {

// gesdd's leading dimension of Vt: its row count, but at least 1.
lapack_int VtLeadingDim(const SvdShape& shape) { return LeadingDim(shape.vt_rows); }

// The complex gesdd's real workspace and every gesdd's integer workspace
// have no LAPACK query; these are the minimum sizes gesdd documents (7k for
// jobz = 'N' covers LAPACK releases before 3.7, which needed more than 5k).
int64_t RealWorkspaceSize(const SvdShape& s) {
  if (!s.compute_uv) return std::max<int64_t>(1, 7 * s.k);
  const int64_t mx = std::max(s.m, s.n);
  return std::max<int64_t>({1, 5 * s.k * s.k + 5 * s.k, 2 * mx * s.k + 2 * s.k * s.k + s.k});
}
int64_t IntWorkspaceSize(const SvdShape& s) { return std::max<int64_t>(1, 8 * s.k); }

// Calls gesdd; `u`/`vt` may be null for jobz = 'N'. With lwork = -1 it is
// the workspace query.
template <typename T>
int32_t CallGesdd(const SvdShape& shape, T* a, Real<T>* s, T* u, T* vt, T* work, lapack_int lwork,
                  Real<T>* rwork, lapack_int* iwork) {
  char jobz = SvdJob(shape);
  lapack_int m = static_cast<lapack_int>(shape.m), n = static_cast<lapack_int>(shape.n);
  lapack_int lda = LeadingDim(shape.m), ldu = LeadingDim(shape.m), ldvt = VtLeadingDim(shape);
  lapack_int info = 0;
  if constexpr (kIsComplex<T>) {
    Lapack<T>::gesdd(&jobz, &m, &n, a, &lda, s, u, &ldu, vt, &ldvt, work, &lwork, rwork, iwork,
                     &info);
  } else {
    Lapack<T>::gesdd(&jobz, &m, &n, a, &lda, s, u, &ldu, vt, &ldvt, work, &lwork, iwork, &info);
  }
  return info;
}

// gesdd's workspaces for a chunk of the batch, and the call on its copy of a.
template <typename T>
struct SvdScratch {
  SvdScratch(const SvdShape& shape, int64_t lwork)
      : a(shape.m * shape.n),
        work(lwork),
        rwork(kIsComplex<T> ? RealWorkspaceSize(shape) : 0),
        iwork(IntWorkspaceSize(shape)) {}
  int32_t Decompose(const SvdShape& shape, Real<T>* s, T* u, T* vt) {
    return CallGesdd<T>(shape, a.data(), s, u, vt, work.data(),
                        static_cast<lapack_int>(work.size()), rwork.data(), iwork.data());
  }
  AlignedVector<T> a;  // gesdd destroys its input
  AlignedVector<T> work;
  AlignedVector<Real<T>> rwork;
  std::vector<lapack_int> iwork;
  T unused_uv{};  // stands in for U and Vt when jobz = 'N' (never read)
};

template <typename T>
int64_t QueryWorkspace(const SvdShape& shape) {
  T size{};
  Real<T> rwork{};
  lapack_int iwork = 0;
  CallGesdd<T>(shape, nullptr, nullptr, nullptr, nullptr, &size, -1, &rwork, &iwork);
  return QueriedSize(size);
}

// gesdd, behind batchpart_svd.
struct Gesdd {
  static constexpr const char* kTarget = kSvdTarget;

  template <typename T>
  static ffi::Error Decompose(ffi::ThreadPool& pool, const SvdShape& shape,
                              const ffi::AnyBuffer& a, ffi::AnyBuffer& s, ffi::AnyBuffer& u,
                              ffi::AnyBuffer& vt, ffi::AnyBuffer& info) {
    const int64_t lwork = shape.k ? QueryWorkspace<T>(shape) : 1;
    BATCHPART_RETURN_IF_ERROR(ExpectLapackInt(kTarget, "workspace size", lwork));
    if constexpr (kIsComplex<T>) {
      BATCHPART_RETURN_IF_ERROR(
          ExpectLapackInt(kTarget, "real workspace size", RealWorkspaceSize(shape)));
    }
    return DecomposeEachSvd<T, SvdScratch<T>>(pool, shape, lwork, /*uv_flops=*/14.0, a, s, u,
                                              vt, info);
  }
};

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(BatchpartSvd, SvdHandler<Gesdd>,
                              BindSvd(ffi::Ffi::Bind().Ctx<ffi::ThreadPool>()));

}  // namespace batchpart::lapack
