// batchpart_getrf and batchpart_getrf_row_major: batched LU factorization
// with partial pivoting, of column-major (getrf) or row-major matrices;
// batches of small matrices interleaved (small_lu.h), others one by one.
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "lapack/batch_loop.h"
#include "lapack/group_loop.h"
#include "lapack/kernel_helpers.h"
#include "lapack/kernels.h"
#include "lapack/lu_steps.h"
#include "lapack/small_lu.h"

namespace batchpart::lapack {
namespace {

// Turns 0-based pivots into the row permutation they describe (apply the
// swaps, in order, to 0..m-1). A pivot outside [i, m) cannot come from a
// factorization; it is skipped rather than trusted with a memory access.
void PivotsToPermutation(const int32_t* pivots, int64_t k, int32_t* perm, int64_t m) {
  std::iota(perm, perm + m, 0);
  for (int64_t i = 0; i < k; ++i) {
    const int32_t p = pivots[i];
    if (p >= i && p < m) std::swap(perm[i], perm[p]);
  }
}

// Factors one column-major matrix in place, by LAPACK on an aligned copy.
template <typename T>
struct ColumnMajor {
  static constexpr bool kRowMajor = false;
  static constexpr interleaved::SizeRange kInterleaved = interleaved::kGetrfColumnMajorSizes<T>;
  static int32_t Factor(const LuShape& shape, T* lu, int32_t* pivots, AlignedVector<T>& scratch) {
    const int64_t size = shape.m * shape.n;
    scratch.assign(lu, lu + size);
    const int32_t info = LapackLu(shape.m, shape.n, scratch.data(), pivots);
    std::copy_n(scratch.data(), size, lu);
    return info;
  }
};

// Factors one row-major matrix in place.
template <typename T>
struct RowMajor {
  static constexpr bool kRowMajor = true;
  static constexpr interleaved::SizeRange kInterleaved = interleaved::kGetrfRowMajorSizes<T>;
  static int32_t Factor(const LuShape& shape, T* lu, int32_t* pivots, AlignedVector<T>& scratch) {
    return FactorRowMajor(shape.m, shape.n, lu, pivots, scratch);
  }
};

// Whether the batch goes through the interleaved kernel (small_lu.h).
template <typename T, template <typename> class Order>
bool FactorInterleaved(const LuShape& shape) {
  return interleaved::UseSmallLu(Order<T>::kInterleaved, std::max(shape.m, shape.n));
}

// The batch in groups of kLanes<T> matrices, each packed, factored and
// unpacked by the interleaved kernel, and a group of a single matrix by its
// one-matrix twin (the same bits); the thread pool shares out groups.
template <typename T, template <typename> class Order>
ffi::Error FactorGroups(ffi::ThreadPool& pool, const LuShape& shape, int64_t batch, const T* a_data,
                        T* lu_data, int32_t* piv_data, int32_t* perm_data, int32_t* info_data) {
  namespace il = interleaved;
  constexpr int W = il::kLanes<T>;
  const int64_t size = shape.m * shape.n, k = shape.k;
  const il::Strides layout = il::Dense(Order<T>::kRowMajor, shape.m, shape.n);
  struct Scratch {
    il::Group<T> group;
    std::vector<int32_t> pivots, perm;
  };
  return il::ForEachGroupOrOne<T>(
      pool, batch, kFlopScale<T> * shape.m * shape.n * shape.k, il::kSmallLuMinGroup<T>,
      [&] {
        return Scratch{il::Group<T>(shape.m, shape.n),
                       std::vector<int32_t>(std::max<int64_t>(1, k) * W),
                       std::vector<int32_t>(shape.m * W)};
      },
      [&](Scratch& s, il::Lanes lanes) {
        int32_t info[W];
        il::PackLanes(s.group, a_data, il::Itself, size, lanes, layout);
        il::FactorGroup(s.group, il::RowSwaps::kWholeRows, s.pivots.data(), info);
        il::UnpackLanes(s.group, lu_data, size, lanes, layout);
        il::PermutationGroup<T>(s.pivots.data(), k, shape.m, s.perm.data());
        il::UnpackIndexLanes<W>(s.pivots.data(), k, piv_data, lanes);
        il::UnpackIndexLanes<W>(s.perm.data(), shape.m, perm_data, lanes);
        std::copy(info, info + lanes.count, info_data + lanes.first);
      },
      [&] { return il::Group<T, 1>(shape.m, shape.n); },
      [&](il::Group<T, 1>& one, il::Lanes lane) {
        const int64_t b = lane.first;
        int32_t* piv = piv_data + b * k;
        il::PackLanes(one, a_data, il::Itself, size, lane, layout);
        info_data[b] = il::FactorOne(one, piv);
        il::UnpackLanes(one, lu_data, size, lane, layout);
        PivotsToPermutation(piv, k, perm_data + b * shape.m, shape.m);
      });
}

template <typename T, template <typename> class Order>
ffi::Error Factor(ffi::ThreadPool& pool, const LuShape& shape, const ffi::AnyBuffer& a,
                  ffi::AnyBuffer& lu, ffi::AnyBuffer& pivots, ffi::AnyBuffer& perm,
                  ffi::AnyBuffer& info) {
  const int64_t size = shape.m * shape.n;
  const T* a_data = a.typed_data<T>();
  T* lu_data = lu.typed_data<T>();
  int32_t* piv_data = pivots.typed_data<int32_t>();
  int32_t* perm_data = perm.typed_data<int32_t>();
  int32_t* info_data = info.typed_data<int32_t>();
  const int64_t batch = Product(shape.batch);
  if (FactorInterleaved<T, Order>(shape)) {
    return FactorGroups<T, Order>(pool, shape, batch, a_data, lu_data, piv_data, perm_data,
                                  info_data);
  }
  const double flops = kFlopScale<T> * shape.m * shape.n * shape.k;
  return ForEachBatchChunk(pool, batch, flops, [&](int64_t begin, int64_t end) {
    AlignedVector<T> scratch;
    for (int64_t b = begin; b < end; ++b) {
      CopyIfDistinct(a_data + b * size, lu_data + b * size, size);
      int32_t* piv = piv_data + b * shape.k;
      info_data[b] = Order<T>::Factor(shape, lu_data + b * size, piv, scratch);
      PivotsToPermutation(piv, shape.k, perm_data + b * shape.m, shape.m);
    }
  });
}

template <template <typename> class Order>
ffi::Error LuImpl(const char* target, ffi::ThreadPool pool, ffi::AnyBuffer a,
                  ffi::Result<ffi::AnyBuffer> lu, ffi::Result<ffi::AnyBuffer> pivots,
                  ffi::Result<ffi::AnyBuffer> perm, ffi::Result<ffi::AnyBuffer> info) {
  BATCHPART_RETURN_IF_ERROR(CheckInitialized(target));
  BATCHPART_ASSIGN_OR_RETURN(const LuShape shape,
                             ValidateGetrf(a, *lu, *pivots, *perm, *info, target));
  return DispatchByDtype(target, a.element_type(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    return Factor<T, Order>(pool, shape, a, *lu, *pivots, *perm, *info);
  });
}

ffi::Error GetrfImpl(ffi::ThreadPool pool, ffi::AnyBuffer a, ffi::Result<ffi::AnyBuffer> lu,
                     ffi::Result<ffi::AnyBuffer> pivots, ffi::Result<ffi::AnyBuffer> perm,
                     ffi::Result<ffi::AnyBuffer> info) {
  return LuImpl<ColumnMajor>(kGetrfTarget, pool, a, lu, pivots, perm, info);
}

ffi::Error GetrfRowMajorImpl(ffi::ThreadPool pool, ffi::AnyBuffer a, ffi::Result<ffi::AnyBuffer> lu,
                             ffi::Result<ffi::AnyBuffer> pivots, ffi::Result<ffi::AnyBuffer> perm,
                             ffi::Result<ffi::AnyBuffer> info) {
  return LuImpl<RowMajor>(kGetrfRowMajorTarget, pool, a, lu, pivots, perm, info);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(BatchpartGetrf, GetrfImpl,
                              BindGetrf(ffi::Ffi::Bind().Ctx<ffi::ThreadPool>()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(BatchpartGetrfRowMajor, GetrfRowMajorImpl,
                              BindGetrf(ffi::Ffi::Bind().Ctx<ffi::ThreadPool>()));

}  // namespace batchpart::lapack
