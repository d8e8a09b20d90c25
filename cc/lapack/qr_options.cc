// batchpart_geqrf (QR reflectors, numpy's "raw" mode) and batchpart_geqp3
// (column-pivoted QR); contracts in option_kernels.h.
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "common/contracts.h"
#include "lapack/batch_loop.h"
#include "lapack/kernel_helpers.h"
#include "lapack/kernel_steps.h"
#include "lapack/option_kernels.h"

namespace batchpart::lapack {
namespace {

constexpr char kGeqrfTarget[] = "batchpart_geqrf";
constexpr char kGeqp3Target[] = "batchpart_geqp3";

// ---- geqrf (raw) --------------------------------------------------------------

template <typename T>
ffi::Error Geqrf(ffi::ThreadPool& pool, const QrShape& shape, const ffi::AnyBuffer& a,
                 ffi::AnyBuffer& h, ffi::AnyBuffer& tau) {
  const int64_t batch = Product(shape.batch);
  if (batch == 0 || shape.k == 0) return ffi::Error::Success();  // h = a (aliased or copied)
  lapack_int m = static_cast<lapack_int>(shape.m), n = static_cast<lapack_int>(shape.n);
  lapack_int lda = LeadingDim(shape.m), query = -1, info = 0;
  T size{};
  Lapack<T>::geqrf(&m, &n, nullptr, &lda, nullptr, &size, &query, &info);
  const int64_t lwork = QueriedSize(size);
  BATCHPART_RETURN_IF_ERROR(ExpectLapackInt(kGeqrfTarget, "workspace size", lwork));
  const T* a_data = a.typed_data<T>();
  T* h_data = h.typed_data<T>();
  T* tau_data = tau.typed_data<T>();
  const int64_t a_size = shape.m * shape.n;
  const double flops = kFlopScale<T> * 2.0 * shape.k * shape.m * shape.n;
  return ForEachBatchChunk(pool, batch, flops, [&](int64_t begin, int64_t end) {
    AlignedVector<T> work(lwork);
    lapack_int m = static_cast<lapack_int>(shape.m), n = static_cast<lapack_int>(shape.n);
    lapack_int lda = LeadingDim(shape.m), lw = static_cast<lapack_int>(lwork), info = 0;
    for (int64_t b = begin; b < end; ++b) {
      T* hb = h_data + b * a_size;
      CopyIfDistinct(a_data + b * a_size, hb, a_size);
      Lapack<T>::geqrf(&m, &n, hb, &lda, tau_data + b * shape.k, work.data(), &lw, &info);
    }
  });
}

ffi::Error GeqrfImpl(ffi::ThreadPool pool, ffi::AnyBuffer a, ffi::Result<ffi::AnyBuffer> h,
                     ffi::Result<ffi::AnyBuffer> tau) {
  BATCHPART_RETURN_IF_ERROR(CheckInitialized(kGeqrfTarget));
  MatrixDims dims;
  BATCHPART_RETURN_IF_ERROR(ExpectOperandA(kGeqrfTarget, a, /*square=*/false, dims));
  const int64_t k = std::min(dims.rows, dims.cols);
  const QrShape shape = {dims.batch, dims.rows, dims.cols, k, /*q_cols=*/k, /*r_rows=*/k};
  BATCHPART_RETURN_IF_ERROR(ExpectBuffer(
      kGeqrfTarget, "result h", *h, WithCore(shape.batch, {shape.m, shape.n}), a.element_type()));
  BATCHPART_RETURN_IF_ERROR(ExpectBuffer(kGeqrfTarget, "result tau", *tau,
                                         WithCore(shape.batch, {shape.k}), a.element_type()));
  return DispatchByDtype(kGeqrfTarget, a.element_type(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (shape.k == 0) {  // nothing to factor; h is a
      const int64_t count = Product(shape.batch) * shape.m * shape.n;
      CopyIfDistinct(a.typed_data<T>(), h->typed_data<T>(), count);
    }
    return Geqrf<T>(pool, shape, a, *h, *tau);
  });
}

// ---- geqp3 (pivoted) ----------------------------------------------------------

// geqp3's real workspace (complex only): 2n, which LAPACK does not query.
int64_t Geqp3RealWorkspace(const QrShape& s) { return std::max<int64_t>(1, 2 * s.n); }

template <typename T>
int32_t CallGeqp3(const QrShape& shape, T* a, lapack_int* jpvt, T* tau, T* work,
                  lapack_int lwork, Real<T>* rwork) {
  lapack_int m = static_cast<lapack_int>(shape.m), n = static_cast<lapack_int>(shape.n);
  lapack_int lda = LeadingDim(shape.m), info = 0;
  if constexpr (kIsComplex<T>) {
    Lapack<T>::geqp3(&m, &n, a, &lda, jpvt, tau, work, &lwork, rwork, &info);
  } else {
    Lapack<T>::geqp3(&m, &n, a, &lda, jpvt, tau, work, &lwork, &info);
  }
  return info;
}

// One workspace serves geqp3 and orgqr: the larger of their queried sizes.
template <typename T>
int64_t QueryGeqp3Workspace(const QrShape& shape) {
  lapack_int m = static_cast<lapack_int>(shape.m), k = static_cast<lapack_int>(shape.k);
  lapack_int q_cols = static_cast<lapack_int>(shape.q_cols);
  lapack_int lda = LeadingDim(shape.m), query = -1, info = 0, jpvt = 0;
  T geqp3_size{}, orgqr_size{};
  Real<T> rwork{};
  CallGeqp3<T>(shape, nullptr, &jpvt, nullptr, &geqp3_size, -1, &rwork);
  Lapack<T>::orgqr(&m, &q_cols, &k, nullptr, &lda, nullptr, &orgqr_size, &query, &info);
  return std::max(QueriedSize(geqp3_size), QueriedSize(orgqr_size));
}

template <typename T>
struct Geqp3Scratch {
  Geqp3Scratch(const QrShape& shape, int64_t lwork)
      : a(shape.m * shape.n),
        tau(std::max<int64_t>(1, shape.k)),
        work(lwork),
        rwork(kIsComplex<T> ? Geqp3RealWorkspace(shape) : 0),
        jpvt(std::max<int64_t>(1, shape.n)) {}
  AlignedVector<T> a, tau, work;
  AlignedVector<Real<T>> rwork;
  std::vector<lapack_int> jpvt;
};

template <typename T>
void PivotedQrOne(const QrShape& shape, const T* a, T* q, T* r, int32_t* p,
                  Geqp3Scratch<T>& s) {
  if (shape.k == 0) {  // nothing to factor: Q = I, R = 0, no column moves
    FillIdentity(q, shape.m, shape.q_cols);
    std::fill_n(r, shape.r_rows * shape.n, T(0));
    std::iota(p, p + shape.n, 0);
    return;
  }
  std::copy_n(a, shape.m * shape.n, s.a.data());
  std::fill(s.jpvt.begin(), s.jpvt.end(), 0);  // every column free to move
  CallGeqp3<T>(shape, s.a.data(), s.jpvt.data(), s.tau.data(), s.work.data(),
               static_cast<lapack_int>(s.work.size()), s.rwork.data());
  for (int64_t j = 0; j < shape.n; ++j) p[j] = s.jpvt[j] - 1;
  WriteQAndR(shape, s.a.data(), s.tau.data(), s.work, q, r);
}

template <typename T>
ffi::Error PivotedQr(ffi::ThreadPool& pool, const QrShape& shape, const ffi::AnyBuffer& a,
                     ffi::AnyBuffer& q, ffi::AnyBuffer& r, ffi::AnyBuffer& p) {
  const int64_t batch = Product(shape.batch);
  if (batch == 0) return ffi::Error::Success();
  const int64_t lwork = shape.k ? QueryGeqp3Workspace<T>(shape) : 1;
  BATCHPART_RETURN_IF_ERROR(ExpectLapackInt(kGeqp3Target, "workspace size", lwork));
  int32_t* p_data = p.typed_data<int32_t>();
  return ForEachQrElement<T, Geqp3Scratch<T>>(
      pool, shape, lwork, a, q, r, [&](int64_t b, const T* ab, T* qb, T* rb, Geqp3Scratch<T>& s) {
        PivotedQrOne<T>(shape, ab, qb, rb, p_data + b * shape.n, s);
      });
}

ffi::Error Geqp3Impl(ffi::ThreadPool pool, ffi::AnyBuffer a, ffi::Result<ffi::AnyBuffer> q,
                     ffi::Result<ffi::AnyBuffer> r, ffi::Result<ffi::AnyBuffer> p,
                     bool full_matrices) {
  BATCHPART_RETURN_IF_ERROR(CheckInitialized(kGeqp3Target));
  BATCHPART_ASSIGN_OR_RETURN(const QrShape shape,
                             ValidateQr(a, *q, *r, full_matrices, kGeqp3Target));
  BATCHPART_RETURN_IF_ERROR(ExpectBuffer(kGeqp3Target, "result p", *p,
                                         WithCore(shape.batch, {shape.n}), ffi::DataType::S32));
  BATCHPART_RETURN_FOR_DTYPE(kGeqp3Target, a.element_type(), PivotedQr, pool, shape, a, *q, *r, *p);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(BatchpartGeqrf, GeqrfImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()    // a
                                  .Ret<ffi::AnyBuffer>()    // h
                                  .Ret<ffi::AnyBuffer>());  // tau

XLA_FFI_DEFINE_HANDLER_SYMBOL(BatchpartGeqp3, Geqp3Impl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()  // a
                                  .Ret<ffi::AnyBuffer>()  // q
                                  .Ret<ffi::AnyBuffer>()  // r
                                  .Ret<ffi::AnyBuffer>()  // p
                                  .Attr<bool>("full_matrices"));

}  // namespace batchpart::lapack
