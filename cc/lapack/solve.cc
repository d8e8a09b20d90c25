// batchpart_gesv and batchpart_gesv_row_major: batched general solve
// A X = B with broadcast batch dims, of column-major (getrf + getrs) or
// row-major matrices (lu_steps.h); batches of small matrices interleaved
// (small_lu.h).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/batch_broadcast.h"
#include "lapack/batch_loop.h"
#include "lapack/group_loop.h"
#include "lapack/kernel_helpers.h"
#include "lapack/kernel_steps.h"
#include "lapack/kernels.h"
#include "lapack/lu_steps.h"
#include "lapack/small_lu.h"

namespace batchpart::lapack {
namespace {

// A chunk's LU of the A it factored last. When A is broadcast against many
// right-hand sides, consecutive batch elements share it, and it is factored
// once per chunk instead of once per element.
template <typename T>
struct LuCache {
  explicit LuCache(int64_t n) : lu(n * n), pivots(std::max<int64_t>(1, n)) {}
  AlignedVector<T> lu, scratch;
  std::vector<int32_t> pivots;  // as the order's Factor writes them
  int64_t a_index = -1;         // which batch element of A `lu` holds
  int32_t info = 0;
};

// The column-major kernel: LAPACK's getrf and getrs (1-based pivots).
template <typename T>
struct ColumnMajor {
  static constexpr bool kRowMajor = false;
  static constexpr interleaved::SizeRange kInterleaved = interleaved::kGesvColumnMajorSizes<T>;
  static int32_t Factor(int64_t n_, T* lu, int32_t* pivots, AlignedVector<T>&) {
    static_assert(sizeof(lapack_int) == sizeof(int32_t), "getrf writes pivots in place");
    lapack_int n = static_cast<lapack_int>(n_), lda = LeadingDim(n_), info = 0;
    Lapack<T>::getrf(&n, &n, lu, &lda, pivots, &info);
    return info;
  }
  static void Substitute(const GesvShape& shape, const T* lu, const int32_t* pivots, T* x) {
    char trans = 'N';
    lapack_int n = static_cast<lapack_int>(shape.n), nrhs = static_cast<lapack_int>(shape.nrhs);
    lapack_int lda = LeadingDim(shape.n), ldb = LeadingDim(shape.n), info = 0;
    Lapack<T>::getrs(&trans, &n, &nrhs, const_cast<T*>(lu), &lda, const_cast<int32_t*>(pivots), x,
                     &ldb, &info);
  }
};

// The row-major kernel: LU and substitution on rows (lu_steps.h).
template <typename T>
struct RowMajor {
  static constexpr bool kRowMajor = true;
  static constexpr interleaved::SizeRange kInterleaved = interleaved::kGesvRowMajorSizes<T>;
  static int32_t Factor(int64_t n, T* lu, int32_t* pivots, AlignedVector<T>& scratch) {
    return FactorRowMajor(n, n, lu, pivots, scratch);
  }
  static void Substitute(const GesvShape& shape, const T* lu, const int32_t* pivots, T* x) {
    SolveRowMajorLu(shape.n, shape.nrhs, lu, pivots, x);
  }
};

// Refreshes the cache with the LU of A's batch element `a_index`.
template <typename T, template <typename> class Order>
void FactorCached(int64_t n, const T* a, int64_t a_index, LuCache<T>& cache) {
  if (cache.a_index == a_index) return;
  std::copy_n(a, n * n, cache.lu.data());
  cache.info = Order<T>::Factor(n, cache.lu.data(), cache.pivots.data(), cache.scratch);
  cache.a_index = a_index;
}

// Solves in place in x (which holds B) with the cached LU; an exactly
// singular A (info > 0) gives an all-NaN x.
template <typename T, template <typename> class Order>
void SolveCached(const GesvShape& shape, const LuCache<T>& cache, T* x, int32_t* info) {
  *info = cache.info;
  if (cache.info != 0) {
    FillNaN(x, shape.n * shape.nrhs);
    return;
  }
  Order<T>::Substitute(shape, cache.lu.data(), cache.pivots.data(), x);
}

// Whether the batch goes through the interleaved kernels (small_lu.h).
template <typename T, template <typename> class Order>
bool SolveInterleaved(const GesvShape& shape) {
  return interleaved::UseSmallLu(Order<T>::kInterleaved, shape.n);
}

// The batch in groups of kLanes<T> elements: each lane's A (broadcast or
// not) and B packed, A factored and the system solved interleaved, X
// unpacked, and a group of a single element by the one-matrix twins (the
// same bits); an element whose A is exactly singular gets an all-NaN X.
template <typename T, template <typename> class Order>
ffi::Error SolveGroups(ffi::ThreadPool& pool, const GesvShape& shape, int64_t batch,
                       const ffi::AnyBuffer& a, const ffi::AnyBuffer& b, ffi::AnyBuffer& x,
                       ffi::AnyBuffer& info) {
  constexpr int W = interleaved::kLanes<T>;
  const BatchBroadcast a_index(shape.x_batch, shape.a_batch);
  const BatchBroadcast b_index(shape.x_batch, shape.b_batch);
  const int64_t n = shape.n, r = shape.nrhs, a_size = n * n, x_size = n * r;
  const interleaved::Strides a_layout = interleaved::Dense(Order<T>::kRowMajor, n, n);
  const interleaved::Strides x_layout = interleaved::Dense(Order<T>::kRowMajor, n, r);
  const T* a_data = a.typed_data<T>();
  const T* b_data = b.typed_data<T>();
  T* x_data = x.typed_data<T>();
  int32_t* info_data = info.typed_data<int32_t>();
  namespace il = interleaved;
  struct Scratch {
    il::Group<T> lu, rhs;
    std::vector<int32_t> pivots;
  };
  struct OneScratch {
    il::Group<T, 1> lu, rhs;
    std::vector<int32_t> pivots;
  };
  return il::ForEachGroupOrOne<T>(
      pool, batch, kFlopScale<T> * (2.0 * n * n * n / 3.0 + 2.0 * n * n * r),
      il::kSmallLuMinGroup<T>,
      [&] {
        return Scratch{il::Group<T>(n, n), il::Group<T>(n, r),
                       std::vector<int32_t>(std::max<int64_t>(1, n) * W)};
      },
      [&](Scratch& s, il::Lanes lanes) {
        int32_t group_info[W];
        il::PackLanes(s.lu, a_data, a_index, a_size, lanes, a_layout);
        il::FactorGroup(s.lu, il::RowSwaps::kFromBlock, s.pivots.data(), group_info);
        il::PackLanes(s.rhs, b_data, b_index, x_size, lanes, x_layout);
        il::SolveGroup(s.lu, s.pivots.data(), s.rhs);
        il::UnpackLanes(s.rhs, x_data, x_size, lanes, x_layout);
        for (int64_t l = 0; l < lanes.count; ++l) {
          const int64_t i = lanes.first + l;
          info_data[i] = group_info[l];
          if (group_info[l] != 0) FillNaN(x_data + i * x_size, x_size);
        }
      },
      [&] {
        return OneScratch{il::Group<T, 1>(n, n), il::Group<T, 1>(n, r),
                          std::vector<int32_t>(std::max<int64_t>(1, n))};
      },
      [&](OneScratch& s, il::Lanes lane) {
        const int64_t i = lane.first;
        il::PackLanes(s.lu, a_data, a_index, a_size, lane, a_layout);
        info_data[i] = il::FactorOne(s.lu, s.pivots.data());
        if (info_data[i] != 0) return FillNaN(x_data + i * x_size, x_size);
        il::PackLanes(s.rhs, b_data, b_index, x_size, lane, x_layout);
        il::SolveOne(s.lu, s.pivots.data(), s.rhs);
        il::UnpackLanes(s.rhs, x_data, x_size, lane, x_layout);
      });
}

template <typename T, template <typename> class Order>
ffi::Error Solve(ffi::ThreadPool& pool, const GesvShape& shape, const ffi::AnyBuffer& a,
                 const ffi::AnyBuffer& b, ffi::AnyBuffer& x, ffi::AnyBuffer& info) {
  const int64_t batch = Product(shape.x_batch);
  if (batch >= 1 && SolveInterleaved<T, Order>(shape)) {
    return SolveGroups<T, Order>(pool, shape, batch, a, b, x, info);
  }
  const int64_t n = shape.n;
  const double flops = kFlopScale<T> * (2.0 * n * n * n / 3.0 + 2.0 * n * n * shape.nrhs);
  return SolveEachBatchElement<T, LuCache<T>>(
      pool, shape, flops, a, b, x, info,
      [&](const T* ai, int64_t a_index, LuCache<T>& cache) {
        FactorCached<T, Order>(n, ai, a_index, cache);
      },
      [&](const LuCache<T>& cache, T* xi, int32_t* info_i) {
        SolveCached<T, Order>(shape, cache, xi, info_i);
      });
}

template <template <typename> class Order>
ffi::Error GesvImpl(const char* target, ffi::ThreadPool pool, ffi::AnyBuffer a, ffi::AnyBuffer b,
                    ffi::Result<ffi::AnyBuffer> x, ffi::Result<ffi::AnyBuffer> info) {
  BATCHPART_RETURN_IF_ERROR(CheckInitialized(target));
  BATCHPART_ASSIGN_OR_RETURN(const GesvShape shape, ValidateGesv(a, b, *x, *info, target));
  return DispatchByDtype(target, a.element_type(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    return Solve<T, Order>(pool, shape, a, b, *x, *info);
  });
}

ffi::Error ColumnMajorGesv(ffi::ThreadPool pool, ffi::AnyBuffer a, ffi::AnyBuffer b,
                           ffi::Result<ffi::AnyBuffer> x, ffi::Result<ffi::AnyBuffer> info) {
  return GesvImpl<ColumnMajor>(kGesvTarget, pool, a, b, x, info);
}

ffi::Error RowMajorGesv(ffi::ThreadPool pool, ffi::AnyBuffer a, ffi::AnyBuffer b,
                        ffi::Result<ffi::AnyBuffer> x, ffi::Result<ffi::AnyBuffer> info) {
  return GesvImpl<RowMajor>(kGesvRowMajorTarget, pool, a, b, x, info);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(BatchpartGesv, ColumnMajorGesv,
                              BindGesv(ffi::Ffi::Bind().Ctx<ffi::ThreadPool>()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(BatchpartGesvRowMajor, RowMajorGesv,
                              BindGesv(ffi::Ffi::Bind().Ctx<ffi::ThreadPool>()));

}  // namespace batchpart::lapack
