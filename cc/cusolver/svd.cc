// batchpart_svd on CUDA: batched singular value decomposition.
#include <algorithm>
#include <cstdint>

#include "cusolver/kernels.h"
#include "cusolver/solver_api.h"

namespace batchpart::cusolver {
namespace {

constexpr const char* kTarget = kSvdTarget;

// Matrices of at most 32 x 32: gesvdjBatched (Jacobi) on all of them at
// once. It computes full U (m x m) and V (n x n) into scratch; u takes U's
// first u_cols columns and vt the first vt_rows rows of V^H.
template <typename T>
ffi::Error SmallSvd(cudaStream_t stream, ffi::ScratchAllocator& scratch, SolverHandle& handle,
                    const SvdShape& shape, int64_t batch, T* work, GpuReal<T>* s, T* u, T* vt,
                    int32_t* info) {
  const int64_t m = shape.m, n = shape.n, k = shape.k;
  T *u_full, *v_full;
  BATCHPART_RETURN_IF_ERROR(Allocate(scratch, kTarget, "U", batch * m * m, &u_full));
  BATCHPART_RETURN_IF_ERROR(Allocate(scratch, kTarget, "V", batch * n * n, &v_full));
  JacobiParams<gesvdjInfo_t, cusolverDnDestroyGesvdjInfo> params;
  BATCHPART_RETURN_IF_ERROR(SolverStatus(kTarget, "cusolverDnCreateGesvdjInfo",
                                         cusolverDnCreateGesvdjInfo(&params.params)));
  BATCHPART_RETURN_IF_ERROR(SolverStatus(kTarget, "cusolverDnXgesvdjSetSortEig",
                                         cusolverDnXgesvdjSetSortEig(params.params, 1)));
  const cusolverEigMode_t jobz =
      shape.compute_uv ? CUSOLVER_EIG_MODE_VECTOR : CUSOLVER_EIG_MODE_NOVECTOR;
  const int m_int = static_cast<int>(m), n_int = static_cast<int>(n);
  BATCHPART_RETURN_IF_ERROR(ForEachBatchChunk(batch, [&](int64_t begin, int count) {
    T* chunk = work + begin * m * n;
    GpuReal<T>* chunk_s = s + begin * k;
    T* chunk_u = u_full + begin * m * m;
    T* chunk_v = v_full + begin * n * n;
    int lwork = 0;
    BATCHPART_RETURN_IF_ERROR(
        SolverStatus(kTarget, "gesvdjBatched_bufferSize",
                     Solver<T>::gesvdjBatched_bufferSize(handle.get(), jobz, m_int, n_int, chunk,
                                                         m_int, chunk_s, chunk_u, m_int, chunk_v,
                                                         n_int, &lwork, params.params, count)));
    T* lapack_work;
    BATCHPART_RETURN_IF_ERROR(Allocate(scratch, kTarget, "gesvdj workspace", lwork, &lapack_work));
    return SolverStatus(
        kTarget, "gesvdjBatched",
        Solver<T>::gesvdjBatched(handle.get(), jobz, m_int, n_int, chunk, m_int, chunk_s, chunk_u,
                                 m_int, chunk_v, n_int, lapack_work, lwork, info + begin,
                                 params.params, count));
  }));
  if (!shape.compute_uv) return ffi::Error::Success();
  const int64_t u_size = m * shape.u_cols, vt_size = shape.vt_rows * n;
  BATCHPART_RETURN_IF_ERROR(CudaStatus(
      kTarget, "CopyMatrix",
      CopyMatrix(stream, u_full, m, m * m, u, m, u_size, m, shape.u_cols, batch, false)));
  return CudaStatus(kTarget, "ConjugateTranspose",
                    ConjugateTranspose(stream, v_full, n, n * n, vt, shape.vt_rows, vt_size,
                                       shape.vt_rows, n, batch));
}

// Larger matrices: gesvd per element. gesvd needs rows >= cols, so a wide
// A (m < n) is decomposed as A^H = U' S V'^H, giving U = V' and Vt = U'^H.
template <typename T>
ffi::Error LargeSvd(cudaStream_t stream, ffi::ScratchAllocator& scratch, SolverHandle& handle,
                    const SvdShape& shape, int64_t batch, T* work, GpuReal<T>* s, T* u, T* vt,
                    int32_t* info) {
  const int64_t m = shape.m, n = shape.n, k = shape.k;
  const bool wide = m < n;
  // The matrix gesvd sees: rows x cols, rows >= cols.
  const int64_t rows = wide ? n : m, cols = wide ? m : n, size = m * n;
  const int rows_int = static_cast<int>(rows), cols_int = static_cast<int>(cols);
  int lwork = 0;
  BATCHPART_RETURN_IF_ERROR(
      SolverStatus(kTarget, "gesvd_bufferSize",
                   Solver<T>::gesvd_bufferSize(handle.get(), rows_int, cols_int, &lwork)));
  T* lapack_work;
  BATCHPART_RETURN_IF_ERROR(Allocate(scratch, kTarget, "gesvd workspace", lwork, &lapack_work));
  const signed char job_reduced = shape.compute_uv ? 'S' : 'N';
  const signed char job = shape.full_matrices && shape.compute_uv ? 'A' : job_reduced;
  const int64_t u_size = m * shape.u_cols, vt_size = shape.vt_rows * n;

  if (!wide) {
    // ldvt: n for 'A' and for 'S' (k = n); also passed for 'N'.
    for (int64_t b = 0; b < batch; ++b) {
      BATCHPART_RETURN_IF_ERROR(SolverStatus(
          kTarget, "gesvd",
          Solver<T>::gesvd(handle.get(), job, job, rows_int, cols_int, work + b * size, rows_int,
                           s + b * k, shape.compute_uv ? u + b * u_size : nullptr, rows_int,
                           shape.compute_uv ? vt + b * vt_size : nullptr, cols_int, lapack_work,
                           lwork, nullptr, info + b)));
    }
    return ffi::Error::Success();
  }

  // Wide: U' (n x vt_rows: 'A' or 'S') and V'^H (m x m) into scratch, then
  // u = (V'^H)^H and vt = U'^H.
  const int64_t u_prime_size = n * shape.vt_rows, vt_prime_size = m * m;
  T *u_prime = nullptr, *vt_prime = nullptr;
  if (shape.compute_uv) {
    BATCHPART_RETURN_IF_ERROR(Allocate(scratch, kTarget, "U'", batch * u_prime_size, &u_prime));
    BATCHPART_RETURN_IF_ERROR(Allocate(scratch, kTarget, "V'^H", batch * vt_prime_size, &vt_prime));
  }
  const signed char jobvt = shape.compute_uv ? 'A' : 'N';
  for (int64_t b = 0; b < batch; ++b) {
    BATCHPART_RETURN_IF_ERROR(SolverStatus(
        kTarget, "gesvd",
        Solver<T>::gesvd(handle.get(), job, jobvt, rows_int, cols_int, work + b * size, rows_int,
                         s + b * k, shape.compute_uv ? u_prime + b * u_prime_size : nullptr,
                         rows_int, shape.compute_uv ? vt_prime + b * vt_prime_size : nullptr,
                         cols_int, lapack_work, lwork, nullptr, info + b)));
  }
  if (!shape.compute_uv) return ffi::Error::Success();
  BATCHPART_RETURN_IF_ERROR(CudaStatus(kTarget, "ConjugateTranspose",
                                       ConjugateTranspose(stream, vt_prime, m, vt_prime_size, u, m,
                                                          u_size, m, shape.u_cols, batch)));
  return CudaStatus(kTarget, "ConjugateTranspose",
                    ConjugateTranspose(stream, u_prime, n, u_prime_size, vt, shape.vt_rows, vt_size,
                                       shape.vt_rows, n, batch));
}

template <typename T>
ffi::Error Decompose(cudaStream_t stream, ffi::ScratchAllocator& scratch, const SvdShape& shape,
                     const ffi::AnyBuffer& a, ffi::AnyBuffer& s, ffi::AnyBuffer& u,
                     ffi::AnyBuffer& vt, ffi::AnyBuffer& info) {
  const int64_t batch = Product(shape.batch), m = shape.m, n = shape.n, k = shape.k;
  if (batch == 0) return ffi::Error::Success();
  GpuReal<T>* s_data = Data<GpuReal<T>>(s);
  T* u_data = Data<T>(u);
  T* vt_data = Data<T>(vt);
  int32_t* info_data = Data<int32_t>(info);
  const int64_t u_size = m * shape.u_cols, vt_size = shape.vt_rows * n;
  if (k == 0) {  // nothing to decompose; U and Vt are identities (as numpy)
    BATCHPART_RETURN_IF_ERROR(
        CudaStatus(kTarget, "FillIdentityColumns",
                   FillIdentityColumns(stream, u_data, m, u_size, m, 0, shape.u_cols, batch)));
    BATCHPART_RETURN_IF_ERROR(CudaStatus(
        kTarget, "FillIdentityColumns",
        FillIdentityColumns(stream, vt_data, shape.vt_rows, vt_size, shape.vt_rows, 0, n, batch)));
    return ZeroInts(kTarget, stream, info_data, batch);
  }

  // The solvers destroy their input: a copy, transposed (conjugated) for a
  // wide matrix on the gesvd path, with non-finite matrices zeroed.
  const bool small = m <= kSmallMatrix && n <= kSmallMatrix;
  const bool transposed = !small && m < n;
  T* work;
  int32_t* flags;
  BATCHPART_RETURN_IF_ERROR(Allocate(scratch, kTarget, "a copy", batch * m * n, &work));
  BATCHPART_RETURN_IF_ERROR(Allocate(scratch, kTarget, "flags", batch, &flags));
  if (transposed) {
    BATCHPART_RETURN_IF_ERROR(
        CudaStatus(kTarget, "ConjugateTranspose",
                   ConjugateTranspose(stream, Data<T>(a), m, m * n, work, n, m * n, n, m, batch)));
  } else {
    BATCHPART_RETURN_IF_ERROR(CopyIfDistinct(kTarget, stream, Data<T>(a), work, batch * m * n));
  }
  BATCHPART_RETURN_IF_ERROR(
      CudaStatus(kTarget, "SanitizeNonFinite",
                 SanitizeNonFinite(stream, work, transposed ? n : m, transposed ? m : n, batch,
                                   Region::kAll, flags)));

  SolverHandle handle;
  BATCHPART_RETURN_IF_ERROR(BorrowSolver(kTarget, stream, &handle));
  if (small) {
    BATCHPART_RETURN_IF_ERROR(SmallSvd<T>(stream, scratch, handle, shape, batch, work, s_data,
                                          u_data, vt_data, info_data));
  } else {
    BATCHPART_RETURN_IF_ERROR(LargeSvd<T>(stream, scratch, handle, shape, batch, work, s_data,
                                          u_data, vt_data, info_data));
  }
  return CudaStatus(kTarget, "FinishDecomposition",
                    FinishDecomposition<T>(stream, flags, info_data, batch, s_data, k, u_data,
                                           u_size, vt_data, vt_size));
}

ffi::Error SvdImpl(cudaStream_t stream, ffi::ScratchAllocator scratch, ffi::AnyBuffer a,
                   ffi::Result<ffi::AnyBuffer> s, ffi::Result<ffi::AnyBuffer> u,
                   ffi::Result<ffi::AnyBuffer> vt, ffi::Result<ffi::AnyBuffer> info,
                   bool full_matrices, bool compute_uv) {
  BATCHPART_ASSIGN_OR_RETURN(const SvdShape shape,
                             ValidateSvd(a, *s, *u, *vt, *info, full_matrices, compute_uv));
  BATCHPART_RETURN_FOR_DTYPE(kTarget, a.element_type(), Decompose, stream, scratch, shape, a, *s,
                             *u, *vt, *info);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(BatchpartSvdCuda, SvdImpl, BindSvd(BindCuda()));

}  // namespace batchpart::cusolver
