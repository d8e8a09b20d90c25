// Compute steps that a base LAPACK kernel and its option variant share
// (batchpart_qr and batchpart_geqp3, batchpart_svd and batchpart_gesvd,
// batchpart_gesv and batchpart_posv), so both variants keep one behaviour.
#ifndef BATCHPART_LAPACK_KERNEL_STEPS_H_
#define BATCHPART_LAPACK_KERNEL_STEPS_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/batch_broadcast.h"
#include "common/contracts.h"
#include "lapack/batch_loop.h"
#include "lapack/kernel_helpers.h"

namespace batchpart::lapack {

// ---- QR (Shape: batch, m, n, k, q_cols, r_rows) ---------------------------

// Writes R (the first r_rows rows of the factored m x n matrix, upper
// triangle only) and Q (orgqr expands the k reflectors below the diagonal of
// the first k columns into q_cols orthonormal columns; it writes every column).
template <typename T, typename Shape>
void WriteQAndR(const Shape& shape, const T* factored, T* tau, AlignedVector<T>& work, T* q, T* r) {
  CopyMatrix(factored, shape.m, r, shape.r_rows, shape.r_rows, shape.n);
  ZeroBelowDiagonal(r, shape.r_rows, shape.n);
  lapack_int m = static_cast<lapack_int>(shape.m), k = static_cast<lapack_int>(shape.k);
  lapack_int q_cols = static_cast<lapack_int>(shape.q_cols), lda = LeadingDim(shape.m);
  lapack_int lwork = static_cast<lapack_int>(work.size()), info = 0;
  CopyMatrix(factored, shape.m, q, shape.m, shape.m, shape.k);
  Lapack<T>::orgqr(&m, &q_cols, &k, q, &lda, tau, work.data(), &lwork, &info);
}

// Runs one(b, a_b, q_b, r_b, scratch) on every batch element, in chunks
// sized by QR's flop count, with a Scratch(shape, lwork) per chunk.
template <typename T, typename Scratch, typename Shape, typename One>
ffi::Error ForEachQrElement(ffi::ThreadPool& pool, const Shape& shape, int64_t lwork,
                            const ffi::AnyBuffer& a, ffi::AnyBuffer& q, ffi::AnyBuffer& r,
                            One one) {
  const T* a_data = a.typed_data<T>();
  T* q_data = q.typed_data<T>();
  T* r_data = r.typed_data<T>();
  const int64_t a_size = shape.m * shape.n, q_size = shape.m * shape.q_cols,
                r_size = shape.r_rows * shape.n;
  const double flops = kFlopScale<T> * 2.0 * shape.k * (shape.m * shape.n + shape.m * shape.q_cols);
  return ForEachBatchChunk(pool, Product(shape.batch), flops, [&](int64_t begin, int64_t end) {
    Scratch scratch(shape, lwork);
    for (int64_t b = begin; b < end; ++b) {
      one(b, a_data + b * a_size, q_data + b * q_size, r_data + b * r_size, scratch);
    }
  });
}

// ---- SVD (Shape: m, n, k, u_cols, vt_rows) --------------------------------

// Decomposes one matrix: U and Vt are identities when k = 0; otherwise
// scratch.Decompose(shape, s, u, vt) factors scratch.a, a copy of `a` (the
// LAPACK routine destroys its input), and returns LAPACK's info. U and Vt are
// passed as scratch.unused_uv without compute_uv; s, U and Vt are NaN when
// `a` is not finite (info kNonFiniteInfo) or the routine fails.
template <typename T, typename Scratch>
void DecomposeSvdOne(const SvdShape& shape, const T* a, Real<T>* s, T* u, T* vt, int32_t* info,
                     Scratch& scratch) {
  const int64_t u_size = shape.m * shape.u_cols, vt_size = shape.vt_rows * shape.n;
  if (shape.k == 0) {
    FillIdentity(u, shape.m, shape.u_cols);
    FillIdentity(vt, shape.vt_rows, shape.n);
    *info = 0;
    return;
  }
  std::copy_n(a, shape.m * shape.n, scratch.a.data());
  if (!AllFinite(scratch.a.data(), shape.m * shape.n)) {
    *info = kNonFiniteInfo;
  } else {
    *info = scratch.Decompose(shape, s, shape.compute_uv ? u : &scratch.unused_uv,
                              shape.compute_uv ? vt : &scratch.unused_uv);
  }
  if (*info != 0) {
    FillNaN(s, shape.k);
    FillNaN(u, u_size);
    FillNaN(vt, vt_size);
  }
}

// DecomposeSvdOne on every batch element, with a Scratch(shape, lwork) per
// chunk; chunks are sized by the routine's flops per element, 4mnk without
// U and Vt and `uv_flops`mnk with them (times the dtype's kFlopScale).
template <typename T, typename Scratch>
ffi::Error DecomposeEachSvd(ffi::ThreadPool& pool, const SvdShape& shape, int64_t lwork,
                            double uv_flops, const ffi::AnyBuffer& a, ffi::AnyBuffer& s,
                            ffi::AnyBuffer& u, ffi::AnyBuffer& vt, ffi::AnyBuffer& info) {
  const T* a_data = a.typed_data<T>();
  Real<T>* s_data = s.typed_data<Real<T>>();
  T* u_data = u.typed_data<T>();
  T* vt_data = vt.typed_data<T>();
  int32_t* info_data = info.typed_data<int32_t>();
  const int64_t a_size = shape.m * shape.n, u_size = shape.m * shape.u_cols,
                vt_size = shape.vt_rows * shape.n;
  const double flops =
      kFlopScale<T> * (shape.compute_uv ? uv_flops : 4.0) * shape.m * shape.n * shape.k;
  return ForEachBatchChunk(pool, Product(shape.batch), flops, [&](int64_t begin, int64_t end) {
    Scratch scratch(shape, lwork);
    for (int64_t b = begin; b < end; ++b) {
      DecomposeSvdOne(shape, a_data + b * a_size, s_data + b * shape.k, u_data + b * u_size,
                      vt_data + b * vt_size, info_data + b, scratch);
    }
  });
}

// gesdd's jobz and gesvd's jobu = jobvt: all of U and Vt ('A'), their first
// k columns / rows ('S'), or neither ('N').
inline char SvdJob(const SvdShape& shape) {
  return !shape.compute_uv ? 'N' : shape.full_matrices ? 'A' : 'S';
}

// The handler of a target with batchpart_svd's contract (errors name
// Algorithm::kTarget): Algorithm::Decompose<T>(pool, shape, a, s, u, vt,
// info) for the operand's dtype T, on a nonempty batch.
template <typename Algorithm>
ffi::Error SvdHandler(ffi::ThreadPool pool, ffi::AnyBuffer a, ffi::Result<ffi::AnyBuffer> s,
                      ffi::Result<ffi::AnyBuffer> u, ffi::Result<ffi::AnyBuffer> vt,
                      ffi::Result<ffi::AnyBuffer> info, bool full_matrices, bool compute_uv) {
  const char* target = Algorithm::kTarget;
  BATCHPART_RETURN_IF_ERROR(CheckInitialized(target));
  BATCHPART_ASSIGN_OR_RETURN(
      const SvdShape shape, ValidateSvd(a, *s, *u, *vt, *info, full_matrices, compute_uv, target));
  if (Product(shape.batch) == 0) return ffi::Error::Success();
  return DispatchByDtype(target, a.element_type(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    return Algorithm::template Decompose<T>(pool, shape, a, *s, *u, *vt, *info);
  });
}

// ---- linear solves (Shape: x_batch, a_batch, b_batch, n, nrhs) -----------

// Solves A X = B for every batch element of x, broadcasting A and B.
// Consecutive elements that share an A factor it once: factor(a, a_index,
// cache) refreshes a Cache(n) per chunk, then solve(cache, x, info)
// overwrites x (holding B) and sets info.
template <typename T, typename Cache, typename Shape, typename Factor, typename Solve>
ffi::Error SolveEachBatchElement(ffi::ThreadPool& pool, const Shape& shape, double flops,
                                 const ffi::AnyBuffer& a, const ffi::AnyBuffer& b,
                                 ffi::AnyBuffer& x, ffi::AnyBuffer& info, Factor factor,
                                 Solve solve) {
  const BatchBroadcast a_index(shape.x_batch, shape.a_batch);
  const BatchBroadcast b_index(shape.x_batch, shape.b_batch);
  const int64_t n = shape.n, a_size = n * n, x_size = n * shape.nrhs;
  const T* a_data = a.typed_data<T>();
  const T* b_data = b.typed_data<T>();
  T* x_data = x.typed_data<T>();
  int32_t* info_data = info.typed_data<int32_t>();
  return ForEachBatchChunk(pool, Product(shape.x_batch), flops, [&](int64_t begin, int64_t end) {
    Cache cache(n);
    for (int64_t i = begin; i < end; ++i) {
      const int64_t ai = a_index(i);
      factor(a_data + ai * a_size, ai, cache);
      T* xi = x_data + i * x_size;
      CopyIfDistinct(b_data + b_index(i) * x_size, xi, x_size);
      solve(cache, xi, info_data + i);
    }
  });
}

}  // namespace batchpart::lapack

#endif  // BATCHPART_LAPACK_KERNEL_STEPS_H_
