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

constexpr const char* kTarget = kSvdTarget;

// gesdd's job: all of U and Vt, their first k columns / rows, or neither.
char Jobz(const SvdShape& shape) {
  return !shape.compute_uv ? 'N' : shape.full_matrices ? 'A' : 'S';
}

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

template <typename T>
struct SvdScratch {
  SvdScratch(const SvdShape& shape, int64_t lwork)
      : a(shape.m * shape.n),
        work(lwork),
        rwork(kIsComplex<T> ? RealWorkspaceSize(shape) : 0),
        iwork(IntWorkspaceSize(shape)) {}
  std::vector<T> a;  // gesdd destroys its input
  std::vector<T> work;
  std::vector<Real<T>> rwork;
  std::vector<lapack_int> iwork;
  T unused_uv{};  // stands in for U and Vt when jobz = 'N' (never read)
};

// Calls gesdd; `u`/`vt` may be null for jobz = 'N'. With lwork = -1 it is
// the workspace query.
template <typename T>
int32_t CallGesdd(const SvdShape& shape, T* a, Real<T>* s, T* u, T* vt, T* work, lapack_int lwork,
                  Real<T>* rwork, lapack_int* iwork) {
  char jobz = Jobz(shape);
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

template <typename T>
int64_t QueryWorkspace(const SvdShape& shape) {
  T size{};
  Real<T> rwork{};
  lapack_int iwork = 0;
  CallGesdd<T>(shape, nullptr, nullptr, nullptr, nullptr, &size, -1, &rwork, &iwork);
  return QueriedSize(size);
}

template <typename T>
ffi::Error Decompose(ffi::ThreadPool& pool, const SvdShape& shape, const ffi::AnyBuffer& a,
                     ffi::AnyBuffer& s, ffi::AnyBuffer& u, ffi::AnyBuffer& vt,
                     ffi::AnyBuffer& info) {
  const int64_t batch = Product(shape.batch);
  if (batch == 0) return ffi::Error::Success();
  const int64_t lwork = shape.k ? QueryWorkspace<T>(shape) : 1;
  BATCHPART_RETURN_IF_ERROR(ExpectLapackInt(kTarget, "workspace size", lwork));
  if constexpr (kIsComplex<T>) {
    BATCHPART_RETURN_IF_ERROR(
        ExpectLapackInt(kTarget, "real workspace size", RealWorkspaceSize(shape)));
  }
  const double flops =
      kFlopScale<T> * (shape.compute_uv ? 14.0 : 4.0) * shape.m * shape.n * shape.k;
  return DecomposeEachSvd<T, SvdScratch<T>>(
      pool, shape, lwork, flops, shape.compute_uv, a, s, u, vt, info,
      [&](SvdScratch<T>& scratch, Real<T>* sb, T* ub, T* vtb) {
        return CallGesdd<T>(shape, scratch.a.data(), sb, ub, vtb, scratch.work.data(),
                            static_cast<lapack_int>(scratch.work.size()), scratch.rwork.data(),
                            scratch.iwork.data());
      });
}

ffi::Error SvdImpl(ffi::ThreadPool pool, ffi::AnyBuffer a, ffi::Result<ffi::AnyBuffer> s,
                   ffi::Result<ffi::AnyBuffer> u, ffi::Result<ffi::AnyBuffer> vt,
                   ffi::Result<ffi::AnyBuffer> info, bool full_matrices, bool compute_uv) {
  BATCHPART_RETURN_IF_ERROR(CheckInitialized(kTarget));
  BATCHPART_ASSIGN_OR_RETURN(const SvdShape shape,
                             ValidateSvd(a, *s, *u, *vt, *info, full_matrices, compute_uv));
  return DispatchByDtype(kTarget, a.element_type(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    return Decompose<T>(pool, shape, a, *s, *u, *vt, *info);
  });
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(BatchpartSvd, SvdImpl,
                              BindSvd(ffi::Ffi::Bind().Ctx<ffi::ThreadPool>()));

}  // namespace batchpart::lapack
