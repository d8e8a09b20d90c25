// batchpart_qr and batchpart_qr_row_major: batched Householder QR of
// column-major matrices (geqrf, then orgqr/ungqr for Q) or of row-major ones
// (qr_steps.h); batches of small matrices interleaved (small_qr.h).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "lapack/batch_loop.h"
#include "lapack/group_loop.h"
#include "lapack/kernel_helpers.h"
#include "lapack/kernel_steps.h"
#include "lapack/kernels.h"
#include "lapack/qr_steps.h"
#include "lapack/small_qr.h"

namespace batchpart::lapack {
namespace {

constexpr const char* kTarget = kQrTarget;

// One workspace serves both routines: the larger of their queried sizes.
template <typename T>
int64_t QueryWorkspace(const QrShape& shape) {
  lapack_int m = static_cast<lapack_int>(shape.m), n = static_cast<lapack_int>(shape.n);
  lapack_int k = static_cast<lapack_int>(shape.k), q_cols = static_cast<lapack_int>(shape.q_cols);
  lapack_int lda = LeadingDim(shape.m), query = -1, info = 0;
  T geqrf_size{}, orgqr_size{};
  Lapack<T>::geqrf(&m, &n, nullptr, &lda, nullptr, &geqrf_size, &query, &info);
  Lapack<T>::orgqr(&m, &q_cols, &k, nullptr, &lda, nullptr, &orgqr_size, &query, &info);
  return std::max(QueriedSize(geqrf_size), QueriedSize(orgqr_size));
}

// Per-thread scratch: geqrf runs on a copy of A (it is needed whole, while
// Q may have fewer columns than A), then the reflectors move into Q.
template <typename T>
struct QrScratch {
  QrScratch(const QrShape& shape, int64_t lwork)
      : a(shape.m * shape.n), tau(std::max<int64_t>(1, shape.k)), work(lwork) {}
  AlignedVector<T> a, tau, work;
};

template <typename T>
void FactorOne(const QrShape& shape, const T* a, T* q, T* r, QrScratch<T>& s) {
  lapack_int m = static_cast<lapack_int>(shape.m), n = static_cast<lapack_int>(shape.n);
  lapack_int lda = LeadingDim(shape.m), lwork = static_cast<lapack_int>(s.work.size()), info = 0;
  std::copy_n(a, shape.m * shape.n, s.a.data());
  Lapack<T>::geqrf(&m, &n, s.a.data(), &lda, s.tau.data(), s.work.data(), &lwork, &info);
  WriteQAndR(shape, s.a.data(), s.tau.data(), s.work, q, r);
}

// Whether a batch of matrices goes through the interleaved QR (small_qr.h).
template <typename T>
bool QrInterleaved(const QrShape& shape, bool row_major) {
  namespace il = interleaved;
  return il::UseSmallQr(row_major ? il::kQrRowMajorSizes<T> : il::kQrColumnMajorSizes<T>, shape.m,
                        shape.n);
}

// The batch in groups of kLanes<T> matrices, each packed, factored and
// unpacked by the interleaved QR, and a group of a single matrix by its
// one-matrix twin (the same bits); the thread pool shares out groups.
template <typename T>
ffi::Error QrGroups(ffi::ThreadPool& pool, const QrShape& shape, bool row_major,
                    const ffi::AnyBuffer& a, ffi::AnyBuffer& q, ffi::AnyBuffer& r) {
  namespace il = interleaved;
  const int64_t m = shape.m, n = shape.n, q_cols = shape.q_cols, r_rows = shape.r_rows;
  const int64_t a_size = m * n, q_size = m * q_cols, r_size = r_rows * n;
  const il::Strides a_layout = il::Dense(row_major, m, n);
  const il::Strides q_layout = il::Dense(row_major, m, q_cols);
  const il::Strides r_layout = il::Dense(row_major, r_rows, n);
  const T* a_data = a.typed_data<T>();
  T* q_data = q.typed_data<T>();
  T* r_data = r.typed_data<T>();
  struct Scratch {
    il::Group<T> a, q, r;
  };
  struct OneScratch {
    il::Group<T, 1> a, q, r;
    std::vector<Real<T>> work;
  };
  return il::ForEachGroupOrOne<T>(
      pool, Product(shape.batch), kFlopScale<T> * 2.0 * shape.k * (m * n + m * q_cols),
      il::kSmallQrMinGroup,
      [&] { return Scratch{il::Group<T>(m, n), il::Group<T>(m, q_cols), il::Group<T>(r_rows, n)}; },
      [&](Scratch& s, il::Lanes lanes) {
        il::PackLanes(s.a, a_data, il::Itself, a_size, lanes, a_layout);
        il::QrGroup(s.a, s.q, s.r);
        il::UnpackLanes(s.q, q_data, q_size, lanes, q_layout);
        il::UnpackLanes(s.r, r_data, r_size, lanes, r_layout);
      },
      [&] {
        return OneScratch{
            il::Group<T, 1>(m, n), il::Group<T, 1>(m, q_cols), il::Group<T, 1>(r_rows, n), {}};
      },
      [&](OneScratch& s, il::Lanes lane) {
        il::PackLanes(s.a, a_data, il::Itself, a_size, lane, a_layout);
        il::QrOne(s.a, s.q, s.r, s.work);
        il::UnpackLanes(s.q, q_data, q_size, lane, q_layout);
        il::UnpackLanes(s.r, r_data, r_size, lane, r_layout);
      });
}

template <typename T>
ffi::Error Factor(ffi::ThreadPool& pool, const QrShape& shape, const ffi::AnyBuffer& a,
                  ffi::AnyBuffer& q, ffi::AnyBuffer& r) {
  const int64_t batch = Product(shape.batch);
  if (batch == 0) return ffi::Error::Success();
  if (QrInterleaved<T>(shape, /*row_major=*/false)) {
    return QrGroups<T>(pool, shape, /*row_major=*/false, a, q, r);
  }
  const int64_t lwork = QueryWorkspace<T>(shape);
  BATCHPART_RETURN_IF_ERROR(ExpectLapackInt(kTarget, "workspace size", lwork));
  return ForEachQrElement<T, QrScratch<T>>(
      pool, shape, lwork, a, q, r, [&](int64_t, const T* ab, T* qb, T* rb, QrScratch<T>& s) {
        FactorOne<T>(shape, ab, qb, rb, s);
      });
}

template <typename T>
ffi::Error FactorRowMajor(ffi::ThreadPool& pool, const QrShape& shape, const ffi::AnyBuffer& a,
                          ffi::AnyBuffer& q, ffi::AnyBuffer& r) {
  if (Product(shape.batch) == 0) return ffi::Error::Success();
  if (QrInterleaved<T>(shape, /*row_major=*/true)) {
    return QrGroups<T>(pool, shape, /*row_major=*/true, a, q, r);
  }
  const int64_t lwork = UsesRowMajorHouseholder<T>(shape) ? 0 : LqWorkspace<T>(shape);
  BATCHPART_RETURN_IF_ERROR(ExpectLapackInt(kQrRowMajorTarget, "workspace size", lwork));
  return ForEachQrElement<T, RowMajorQrScratch<T>>(
      pool, shape, lwork, a, q, r,
      [&](int64_t, const T* ab, T* qb, T* rb, RowMajorQrScratch<T>& s) {
        RowMajorQr<T>(shape, ab, qb, rb, s);
      });
}

template <bool kRowMajor>
ffi::Error QrImpl(ffi::ThreadPool pool, ffi::AnyBuffer a, ffi::Result<ffi::AnyBuffer> q,
                  ffi::Result<ffi::AnyBuffer> r, bool full_matrices) {
  constexpr const char* target = kRowMajor ? kQrRowMajorTarget : kTarget;
  BATCHPART_RETURN_IF_ERROR(CheckInitialized(target));
  BATCHPART_ASSIGN_OR_RETURN(const QrShape shape, ValidateQr(a, *q, *r, full_matrices, target));
  return DispatchByDtype(target, a.element_type(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (kRowMajor) {
      return FactorRowMajor<T>(pool, shape, a, *q, *r);
    } else {
      return Factor<T>(pool, shape, a, *q, *r);
    }
  });
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(BatchpartQr, QrImpl</*kRowMajor=*/false>,
                              BindQr(ffi::Ffi::Bind().Ctx<ffi::ThreadPool>()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(BatchpartQrRowMajor, QrImpl</*kRowMajor=*/true>,
                              BindQr(ffi::Ffi::Bind().Ctx<ffi::ThreadPool>()));

}  // namespace batchpart::lapack
