// batchpart_eigh: batched Hermitian eigendecomposition (syevd / heevd);
// batches of small matrices interleaved (small_eigh.h).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "lapack/batch_loop.h"
#include "lapack/group_loop.h"
#include "lapack/kernel_helpers.h"
#include "lapack/kernels.h"
#include "lapack/small_eigh.h"

namespace batchpart::lapack {
namespace {

constexpr const char* kTarget = kEighTarget;

// Sizes of syevd's three workspaces (heevd's real one is rwork; syevd has
// none), from LAPACK's own query.
struct EighWorkspace {
  int64_t work = 1, rwork = 1, iwork = 1;
};

template <typename T>
EighWorkspace QueryWorkspace(int64_t n_, char jobz, char uplo) {
  lapack_int n = static_cast<lapack_int>(n_), lda = LeadingDim(n_), query = -1, info = 0;
  T work{};
  Real<T> rwork{};
  lapack_int iwork = 0;
  EighWorkspace sizes;
  if constexpr (kIsComplex<T>) {
    Lapack<T>::syevd(&jobz, &uplo, &n, nullptr, &lda, nullptr, &work, &query, &rwork, &query,
                     &iwork, &query, &info);
    sizes.rwork = QueriedSize(rwork);
  } else {
    Lapack<T>::syevd(&jobz, &uplo, &n, nullptr, &lda, nullptr, &work, &query, &iwork, &query,
                     &info);
  }
  sizes.work = QueriedSize(work);
  sizes.iwork = std::max<lapack_int>(1, iwork);
  return sizes;
}

// Whether the triangle syevd reads is finite (the other one is ignored, so
// garbage there must not cost the result).
template <typename T>
bool TriangleFinite(const T* a, int64_t n, bool lower) {
  for (int64_t j = 0; j < n; ++j) {
    const int64_t first = lower ? j : 0, count = lower ? n - j : j + 1;
    if (!AllFinite(a + j * n + first, count)) return false;
  }
  return true;
}

template <typename T>
struct EighScratch {
  EighScratch(const EighShape& shape, const EighWorkspace& sizes)
      : a(shape.v_cols ? 0 : shape.n * shape.n),
        work(sizes.work),
        rwork(kIsComplex<T> ? sizes.rwork : 0),
        iwork(sizes.iwork) {}
  AlignedVector<T> a;  // the matrix LAPACK overwrites when v is not wanted
  AlignedVector<T> work;
  AlignedVector<Real<T>> rwork;
  std::vector<lapack_int> iwork;
};

template <typename T>
int32_t CallSyevd(char jobz, char uplo, int64_t n_, T* a, Real<T>* w, EighScratch<T>& s) {
  lapack_int n = static_cast<lapack_int>(n_), lda = LeadingDim(n_), info = 0;
  lapack_int lwork = static_cast<lapack_int>(s.work.size());
  lapack_int liwork = static_cast<lapack_int>(s.iwork.size());
  if constexpr (kIsComplex<T>) {
    lapack_int lrwork = static_cast<lapack_int>(s.rwork.size());
    Lapack<T>::syevd(&jobz, &uplo, &n, a, &lda, w, s.work.data(), &lwork, s.rwork.data(), &lrwork,
                     s.iwork.data(), &liwork, &info);
  } else {
    Lapack<T>::syevd(&jobz, &uplo, &n, a, &lda, w, s.work.data(), &lwork, s.iwork.data(), &liwork,
                     &info);
  }
  return info;
}

// Decomposes one matrix. `v` is the eigenvector output (n x n), or null when
// only eigenvalues are wanted.
template <typename T>
void DecomposeOne(const EighShape& shape, bool lower, const T* a, Real<T>* w, T* v, int32_t* info,
                  EighScratch<T>& s) {
  const int64_t n = shape.n;
  T* matrix = v ? v : s.a.data();
  std::copy_n(a, n * n, matrix);
  *info = TriangleFinite(matrix, n, lower)
              ? CallSyevd<T>(v ? 'V' : 'N', lower ? 'L' : 'U', n, matrix, w, s)
              : kNonFiniteInfo;
  if (*info != 0) {
    FillNaN(w, n);
    if (v) FillNaN(v, n * n);
  }
}

// The batch in groups of kLanes<T> matrices, each packed (the triangle
// read), decomposed by the interleaved Jacobi and unpacked; the thread pool
// shares out groups.
template <typename T>
ffi::Error DecomposeGroups(ffi::ThreadPool& pool, const EighShape& shape, bool lower,
                           const ffi::AnyBuffer& a, ffi::AnyBuffer& w, ffi::AnyBuffer& v,
                           ffi::AnyBuffer& info) {
  namespace il = interleaved;
  constexpr int W = il::kLanes<T>;
  const int64_t n = shape.n;
  const bool vectors = shape.v_cols > 0;
  const T* a_data = a.typed_data<T>();
  Real<T>* w_data = w.typed_data<Real<T>>();
  T* v_data = vectors ? v.typed_data<T>() : nullptr;
  int32_t* info_data = info.typed_data<int32_t>();
  struct Scratch {
    il::Group<T> a;
    il::Group<Real<T>> w;
    il::Group<T> v;
    il::EighWork<T> work;
  };
  // About eight sweeps of n^2 / 2 rotations, each a few flops per element
  // of two rows and columns of A (and of two columns of V); complex
  // arithmetic about four times that.
  const double flops = kFlopScale<T> * (vectors ? 36.0 : 18.0) * n * n * n;
  return il::ForEachGroup<T>(
      pool, Product(shape.batch), flops,
      [&] {
        return Scratch{il::Group<T>(n, n), il::Group<Real<T>>(1, n),
                       il::Group<T>(vectors ? n : 0, vectors ? n : 0), il::EighWork<T>(n, vectors)};
      },
      [&](Scratch& s, il::Lanes lanes) {
        int32_t lane_info[W];
        il::PackTriangleLanes(s.a, a_data, il::Itself, n * n, lanes, il::ColumnMajor(n), lower);
        il::EighGroup(s.a, lower, vectors, s.work, s.w, s.v, lane_info);
        il::UnpackLanes(s.w, w_data, n, lanes, il::RowMajor(n));
        if (vectors) il::UnpackLanes(s.v, v_data, n * n, lanes, il::ColumnMajor(n));
        std::copy_n(lane_info, lanes.count, info_data + lanes.first);
      });
}

template <typename T>
ffi::Error Decompose(ffi::ThreadPool& pool, const EighShape& shape, bool lower,
                     const ffi::AnyBuffer& a, ffi::AnyBuffer& w, ffi::AnyBuffer& v,
                     ffi::AnyBuffer& info) {
  const int64_t batch = Product(shape.batch), n = shape.n;
  if (batch == 0) return ffi::Error::Success();
  if (interleaved::UseSmallEigh<T>(n)) {
    return DecomposeGroups<T>(pool, shape, lower, a, w, v, info);
  }
  const bool vectors = shape.v_cols > 0;
  const EighWorkspace sizes = QueryWorkspace<T>(n, vectors ? 'V' : 'N', lower ? 'L' : 'U');
  BATCHPART_RETURN_IF_ERROR(ExpectLapackInt(kTarget, "workspace size", sizes.work));
  BATCHPART_RETURN_IF_ERROR(ExpectLapackInt(kTarget, "workspace size", sizes.rwork));
  const T* a_data = a.typed_data<T>();
  Real<T>* w_data = w.typed_data<Real<T>>();
  T* v_data = vectors ? v.typed_data<T>() : nullptr;
  int32_t* info_data = info.typed_data<int32_t>();
  const double flops = kFlopScale<T> * (vectors ? 9.0 : 2.0) * n * n * n;
  return ForEachBatchChunk(pool, batch, flops, [&](int64_t begin, int64_t end) {
    EighScratch<T> scratch(shape, sizes);
    for (int64_t b = begin; b < end; ++b) {
      DecomposeOne<T>(shape, lower, a_data + b * n * n, w_data + b * n,
                      vectors ? v_data + b * n * n : nullptr, info_data + b, scratch);
    }
  });
}

ffi::Error EighImpl(ffi::ThreadPool pool, ffi::AnyBuffer a, ffi::Result<ffi::AnyBuffer> w,
                    ffi::Result<ffi::AnyBuffer> v, ffi::Result<ffi::AnyBuffer> info, bool lower,
                    bool compute_vectors) {
  BATCHPART_RETURN_IF_ERROR(CheckInitialized(kTarget));
  BATCHPART_ASSIGN_OR_RETURN(const EighShape shape,
                             ValidateEigh(a, *w, *v, *info, compute_vectors));
  BATCHPART_RETURN_FOR_DTYPE(kTarget, a.element_type(), Decompose, pool, shape, lower, a, *w, *v,
                             *info);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(BatchpartEigh, EighImpl,
                              BindEigh(ffi::Ffi::Bind().Ctx<ffi::ThreadPool>()));

}  // namespace batchpart::lapack
