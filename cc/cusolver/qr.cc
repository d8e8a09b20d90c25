// batchpart_qr on CUDA: batched Householder QR (geqrf, then orgqr/ungqr).
#include <algorithm>
#include <cstdint>

#include "cusolver/kernels.h"
#include "cusolver/solver_api.h"

namespace batchpart::cusolver {
namespace {

constexpr const char* kTarget = kQrTarget;

template <typename T>
ffi::Error Factor(cudaStream_t stream, ffi::ScratchAllocator& scratch, const QrShape& shape,
                  const ffi::AnyBuffer& a, ffi::AnyBuffer& q, ffi::AnyBuffer& r) {
  const int64_t batch = Product(shape.batch), m = shape.m, n = shape.n, k = shape.k;
  const int64_t q_cols = shape.q_cols, r_rows = shape.r_rows;
  if (batch == 0 || m == 0) return ffi::Error::Success();  // q and r are empty
  T* q_data = Data<T>(q);
  T* r_data = Data<T>(r);
  const int64_t a_size = m * n, q_size = m * q_cols, r_size = r_rows * n;
  if (k == 0) {  // n == 0: r is empty, q the identity's first q_cols columns
    return CudaStatus(kTarget, "FillIdentityColumns",
                      FillIdentityColumns(stream, q_data, m, q_size, m, 0, q_cols, batch));
  }

  // geqrf works on a copy of A (needed whole, while Q may have fewer columns).
  T *work, *tau, *lapack_work;
  int* dev_info;
  BATCHPART_RETURN_IF_ERROR(Allocate(scratch, kTarget, "a copy", batch * a_size, &work));
  BATCHPART_RETURN_IF_ERROR(Allocate(scratch, kTarget, "tau", batch * k, &tau));
  BATCHPART_RETURN_IF_ERROR(Allocate(scratch, kTarget, "info", 1, &dev_info));
  BATCHPART_RETURN_IF_ERROR(CopyIfDistinct(kTarget, stream, Data<T>(a), work, batch * a_size));

  SolverHandle handle;
  BATCHPART_RETURN_IF_ERROR(BorrowSolver(kTarget, stream, &handle));
  const int m_int = static_cast<int>(m), n_int = static_cast<int>(n), k_int = static_cast<int>(k);
  const int q_cols_int = static_cast<int>(q_cols);
  int geqrf_lwork = 0, orgqr_lwork = 0;
  BATCHPART_RETURN_IF_ERROR(SolverStatus(
      kTarget, "geqrf_bufferSize",
      Solver<T>::geqrf_bufferSize(handle.get(), m_int, n_int, work, m_int, &geqrf_lwork)));
  BATCHPART_RETURN_IF_ERROR(
      SolverStatus(kTarget, "orgqr_bufferSize",
                   Solver<T>::orgqr_bufferSize(handle.get(), m_int, q_cols_int, k_int, q_data,
                                               m_int, tau, &orgqr_lwork)));
  const int lwork = std::max(geqrf_lwork, orgqr_lwork);
  BATCHPART_RETURN_IF_ERROR(Allocate(scratch, kTarget, "workspace", lwork, &lapack_work));

  for (int64_t b = 0; b < batch; ++b) {
    BATCHPART_RETURN_IF_ERROR(
        SolverStatus(kTarget, "geqrf",
                     Solver<T>::geqrf(handle.get(), m_int, n_int, work + b * a_size, m_int,
                                      tau + b * k, lapack_work, lwork, dev_info)));
  }
  // R: the first r_rows rows of the factored matrix, upper triangle only.
  BATCHPART_RETURN_IF_ERROR(CudaStatus(
      kTarget, "CopyMatrix",
      CopyMatrix(stream, work, m, a_size, r_data, r_rows, r_size, r_rows, n, batch, true)));
  // Q: the k reflectors (below the diagonal of the first k columns) and unit
  // columns after them, expanded in place by orgqr.
  BATCHPART_RETURN_IF_ERROR(
      CudaStatus(kTarget, "CopyMatrix",
                 CopyMatrix(stream, work, m, a_size, q_data, m, q_size, m, k, batch, false)));
  BATCHPART_RETURN_IF_ERROR(
      CudaStatus(kTarget, "FillIdentityColumns",
                 FillIdentityColumns(stream, q_data, m, q_size, m, k, q_cols, batch)));
  for (int64_t b = 0; b < batch; ++b) {
    BATCHPART_RETURN_IF_ERROR(
        SolverStatus(kTarget, "orgqr",
                     Solver<T>::orgqr(handle.get(), m_int, q_cols_int, k_int, q_data + b * q_size,
                                      m_int, tau + b * k, lapack_work, lwork, dev_info)));
  }
  return ffi::Error::Success();
}

ffi::Error QrImpl(cudaStream_t stream, ffi::ScratchAllocator scratch, ffi::AnyBuffer a,
                  ffi::Result<ffi::AnyBuffer> q, ffi::Result<ffi::AnyBuffer> r,
                  bool full_matrices) {
  BATCHPART_ASSIGN_OR_RETURN(const QrShape shape, ValidateQr(a, *q, *r, full_matrices));
  BATCHPART_RETURN_FOR_DTYPE(kTarget, a.element_type(), Factor, stream, scratch, shape, a, *q, *r);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(BatchpartQrCuda, QrImpl, BindQr(BindCuda()));

}  // namespace batchpart::cusolver
