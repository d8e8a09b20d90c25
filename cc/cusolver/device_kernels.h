// Small CUDA kernels around the cuSOLVER/cuBLAS calls: pointer arrays for the
// batched APIs, broadcast copies, pivots to permutations, NaN for failed batch
// elements, and the copies/transposes that shape results.
//
// Declared here for the host-compiled handlers; defined (and instantiated for
// float, double, cuComplex and cuDoubleComplex) in device_kernels.cu. Every
// launcher enqueues on `stream` and returns cudaGetLastError(); none
// synchronizes. Matrices are column-major; `stride` is the distance in
// elements between consecutive batch elements, `ld` the leading dimension.
#ifndef BATCHPART_CUSOLVER_DEVICE_KERNELS_H_
#define BATCHPART_CUSOLVER_DEVICE_KERNELS_H_

#include <cuComplex.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#if defined(__CUDACC__)
#define BATCHPART_HOST_DEVICE __host__ __device__
#else
#define BATCHPART_HOST_DEVICE
#endif

namespace batchpart::cusolver {

// Most batch dims an operand's broadcast map may keep after merging (see
// MakeBroadcastIndex in solver_api.h); a plain value passed to kernels.
inline constexpr int kMaxBroadcastRank = 8;

// Maps a flat (row-major) index over the output batch to the flat index of
// the operand's batch element that feeds it (cc/common/batch_broadcast.h, as
// a trivially copyable value usable on the device).
struct BroadcastIndex {
  int rank = 0;
  int64_t dims[kMaxBroadcastRank] = {};     // output batch dims
  int64_t strides[kMaxBroadcastRank] = {};  // the operand's; 0 where broadcast

  BATCHPART_HOST_DEVICE int64_t operator()(int64_t out_index) const {
    int64_t in_index = 0;
    for (int d = rank - 1; d >= 0; --d) {
      in_index += (out_index % dims[d]) * strides[d];
      out_index /= dims[d];
    }
    return in_index;
  }
};

// The real type of a cuSOLVER scalar type (float for cuComplex).
template <typename T>
struct GpuRealOf {
  using type = T;
};
template <>
struct GpuRealOf<cuComplex> {
  using type = float;
};
template <>
struct GpuRealOf<cuDoubleComplex> {
  using type = double;
};
template <typename T>
using GpuReal = typename GpuRealOf<T>::type;

// Which part of a matrix SanitizeNonFinite inspects.
enum class Region : int { kAll = 0, kLower = 1, kUpper = 2 };

// ptrs[i] = base + index(i) * stride, for i < count.
template <typename T>
cudaError_t MakePointers(cudaStream_t stream, T* base, int64_t stride, BroadcastIndex index,
                         int64_t count, T** ptrs);

// dst[i] (elements elements each) = src[index(i)], for i < count.
template <typename T>
cudaError_t BroadcastCopy(cudaStream_t stream, const T* src, int64_t elements, BroadcastIndex index,
                          int64_t count, T* dst);

// data[i] = conj(data[i]) (complex types only).
template <typename T>
cudaError_t Conjugate(cudaStream_t stream, T* data, int64_t count);

// dst(i, j) = src(i, j) for i < rows, j < cols; with zero_below_diagonal,
// dst(i, j) = 0 where i > j.
template <typename T>
cudaError_t CopyMatrix(cudaStream_t stream, const T* src, int64_t src_ld, int64_t src_stride,
                       T* dst, int64_t dst_ld, int64_t dst_stride, int64_t rows, int64_t cols,
                       int64_t batch, bool zero_below_diagonal);

// dst(i, j) = conj(src(j, i)) for i < rows, j < cols (rows x cols is dst's
// block).
template <typename T>
cudaError_t ConjugateTranspose(cudaStream_t stream, const T* src, int64_t src_ld,
                               int64_t src_stride, T* dst, int64_t dst_ld, int64_t dst_stride,
                               int64_t rows, int64_t cols, int64_t batch);

// dst(i, j) = (i == j) for i < rows and first_col <= j < end_col.
template <typename T>
cudaError_t FillIdentityColumns(cudaStream_t stream, T* dst, int64_t ld, int64_t stride,
                                int64_t rows, int64_t first_col, int64_t end_col, int64_t batch);

// Where `region` of a rows x cols matrix holds a NaN or an Inf, the whole
// matrix becomes zero (so that no iterative solver ever sees it) and
// flags[b] = 1; elsewhere flags[b] = 0 and, for a triangular region of a
// square matrix, the other triangle is overwritten with the conjugate mirror
// of the region (so garbage there cannot reach the solver either).
template <typename T>
cudaError_t SanitizeNonFinite(cudaStream_t stream, T* a, int64_t rows, int64_t cols, int64_t batch,
                              Region region, int32_t* flags);

// After potrf on n x n matrices: where info != 0 or the factor's triangle is
// not finite, the matrix becomes all NaN (info, if 0, becomes the 1-based
// column of the first non-finite diagonal entry, else n); elsewhere the
// other triangle is zeroed.
// Replaces the lower (or upper) triangle of each column-major n x n matrix
// by that of (A + A^H) / 2 (jax's symmetrize_input, on the device).
template <typename T>
cudaError_t SymmetrizeTriangle(cudaStream_t stream, T* a, int64_t n, int64_t batch, bool lower);

template <typename T>
cudaError_t FinishCholesky(cudaStream_t stream, T* a, int64_t n, int64_t batch, bool lower,
                           int32_t* info);

// getrf's 1-based pivots (k per element) become 0-based, and perm (m per
// element) the permutation they describe. A pivot outside [i, m) is skipped.
cudaError_t PivotsToPermutation(cudaStream_t stream, int32_t* pivots, int64_t k, int32_t* perm,
                                int64_t m, int64_t batch);

// info[b] = -4 where flags[b] (a refused non-finite matrix); where info[b]
// is then nonzero, element b of every output becomes NaN: values_size
// elements of `values` (eigenvalues, singular values), first_size of `first`
// and second_size of `second` (eigenvectors; U and Vt). A null or empty
// output is skipped.
template <typename T>
cudaError_t FinishDecomposition(cudaStream_t stream, const int32_t* flags, int32_t* info,
                                int64_t batch, GpuReal<T>* values, int64_t values_size, T* first,
                                int64_t first_size, T* second, int64_t second_size);

// info[i] = a_info[index(i)]; where it is nonzero, x's element i (size
// elements) becomes NaN.
template <typename T>
cudaError_t FinishSolve(cudaStream_t stream, const int32_t* a_info, BroadcastIndex index,
                        int32_t* info, T* x, int64_t size, int64_t batch);

}  // namespace batchpart::cusolver

#endif  // BATCHPART_CUSOLVER_DEVICE_KERNELS_H_
