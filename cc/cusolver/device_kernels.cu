// The kernels declared in device_kernels.h. They move little data next to
// the cuSOLVER/cuBLAS calls they surround; simplicity wins over peak
// bandwidth. Elementwise kernels use grid-stride loops over 64-bit indices;
// per-matrix kernels use one block per batch element (grid-stride over the
// batch).
#include <cuComplex.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cusolver/device_kernels.h"

namespace batchpart::cusolver {
namespace {

constexpr int kThreads = 256;
// Grid sizes are capped; the loops cover the rest.
constexpr int64_t kMaxBlocks = 1 << 16;

int Blocks(int64_t work, int64_t per_block = kThreads) {
  const int64_t blocks = (work + per_block - 1) / per_block;
  return static_cast<int>(std::max<int64_t>(1, std::min(blocks, kMaxBlocks)));
}

// ---- scalar helpers ----------------------------------------------------------

__device__ inline bool Finite(float x) { return isfinite(x); }
__device__ inline bool Finite(double x) { return isfinite(x); }
__device__ inline bool Finite(cuComplex x) { return isfinite(x.x) && isfinite(x.y); }
__device__ inline bool Finite(cuDoubleComplex x) { return isfinite(x.x) && isfinite(x.y); }

__device__ inline float Conj(float x) { return x; }
__device__ inline double Conj(double x) { return x; }
__device__ inline cuComplex Conj(cuComplex x) { return cuConjf(x); }
__device__ inline cuDoubleComplex Conj(cuDoubleComplex x) { return cuConj(x); }

template <typename T>
struct Scalar;
template <>
struct Scalar<float> {
  __device__ static float Zero() { return 0.0f; }
  __device__ static float One() { return 1.0f; }
  __device__ static float NaN() { return __int_as_float(0x7fc00000); }
};
template <>
struct Scalar<double> {
  __device__ static double Zero() { return 0.0; }
  __device__ static double One() { return 1.0; }
  __device__ static double NaN() { return __longlong_as_double(0x7ff8000000000000LL); }
};
__device__ inline cuComplex MakeComplex(float re, float im) { return make_cuComplex(re, im); }
__device__ inline cuDoubleComplex MakeComplex(double re, double im) {
  return make_cuDoubleComplex(re, im);
}
// A complex type's constants, built from those of its real type R.
template <typename C, typename R>
struct ComplexScalar {
  __device__ static C Zero() { return MakeComplex(R(0), R(0)); }
  __device__ static C One() { return MakeComplex(R(1), R(0)); }
  __device__ static C NaN() { return MakeComplex(Scalar<R>::NaN(), Scalar<R>::NaN()); }
};
template <>
struct Scalar<cuComplex> : ComplexScalar<cuComplex, float> {};
template <>
struct Scalar<cuDoubleComplex> : ComplexScalar<cuDoubleComplex, double> {};
__device__ inline int64_t GlobalThread() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ inline int64_t GlobalStride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

// ---- kernels -------------------------------------------------------------------

template <typename T>
__global__ void MakePointersKernel(T* base, int64_t stride, BroadcastIndex index, int64_t count,
                                   T** ptrs) {
  for (int64_t i = GlobalThread(); i < count; i += GlobalStride()) {
    ptrs[i] = base + index(i) * stride;
  }
}

template <typename T>
__global__ void BroadcastCopyKernel(const T* src, int64_t elements, BroadcastIndex index,
                                    int64_t total, T* dst) {
  for (int64_t e = GlobalThread(); e < total; e += GlobalStride()) {
    const int64_t i = e / elements, j = e % elements;
    dst[e] = src[index(i) * elements + j];
  }
}

template <typename T>
__global__ void ConjugateKernel(T* data, int64_t count) {
  for (int64_t e = GlobalThread(); e < count; e += GlobalStride()) data[e] = Conj(data[e]);
}

template <typename T>
__global__ void CopyMatrixKernel(const T* src, int64_t src_ld, int64_t src_stride, T* dst,
                                 int64_t dst_ld, int64_t dst_stride, int64_t rows, int64_t cols,
                                 int64_t total, bool zero_below_diagonal) {
  for (int64_t e = GlobalThread(); e < total; e += GlobalStride()) {
    const int64_t i = e % rows, rest = e / rows, j = rest % cols, b = rest / cols;
    dst[b * dst_stride + j * dst_ld + i] =
        zero_below_diagonal && i > j ? Scalar<T>::Zero() : src[b * src_stride + j * src_ld + i];
  }
}

template <typename T>
__global__ void ConjugateTransposeKernel(const T* src, int64_t src_ld, int64_t src_stride, T* dst,
                                         int64_t dst_ld, int64_t dst_stride, int64_t rows,
                                         int64_t cols, int64_t total) {
  for (int64_t e = GlobalThread(); e < total; e += GlobalStride()) {
    const int64_t i = e % rows, rest = e / rows, j = rest % cols, b = rest / cols;
    dst[b * dst_stride + j * dst_ld + i] = Conj(src[b * src_stride + i * src_ld + j]);
  }
}

template <typename T>
__global__ void FillIdentityColumnsKernel(T* dst, int64_t ld, int64_t stride, int64_t rows,
                                          int64_t first_col, int64_t cols, int64_t total) {
  for (int64_t e = GlobalThread(); e < total; e += GlobalStride()) {
    const int64_t i = e % rows, rest = e / rows, j = first_col + rest % cols, b = rest / cols;
    dst[b * stride + j * ld + i] = i == j ? Scalar<T>::One() : Scalar<T>::Zero();
  }
}

__device__ inline bool InRegion(Region region, int64_t i, int64_t j) {
  return region == Region::kAll || (region == Region::kLower ? i >= j : i <= j);
}

template <typename T>
__global__ void SanitizeNonFiniteKernel(T* a, int64_t rows, int64_t cols, int64_t batch,
                                        Region region, int32_t* flags) {
  const int64_t size = rows * cols;
  for (int64_t b = blockIdx.x; b < batch; b += gridDim.x) {
    T* m = a + b * size;
    int bad = 0;
    for (int64_t e = threadIdx.x; e < size; e += blockDim.x) {
      if (InRegion(region, e % rows, e / rows) && !Finite(m[e])) bad = 1;
    }
    bad = __syncthreads_or(bad);
    if (bad) {
      for (int64_t e = threadIdx.x; e < size; e += blockDim.x) m[e] = Scalar<T>::Zero();
    } else if (region != Region::kAll) {
      // Only the other triangle is written, only from the region: no races.
      for (int64_t e = threadIdx.x; e < size; e += blockDim.x) {
        const int64_t i = e % rows, j = e / rows;
        if (!InRegion(region, i, j)) m[e] = Conj(m[i * rows + j]);
      }
    }
    if (threadIdx.x == 0) flags[b] = bad;
    __syncthreads();
  }
}

__device__ inline float Mean(float x, float y) { return (x + y) / 2; }
__device__ inline double Mean(double x, double y) { return (x + y) / 2; }
__device__ inline cuComplex Mean(cuComplex x, cuComplex y) {
  return make_cuComplex((x.x + y.x) / 2, (x.y + y.y) / 2);
}
__device__ inline cuDoubleComplex Mean(cuDoubleComplex x, cuDoubleComplex y) {
  return make_cuDoubleComplex((x.x + y.x) / 2, (x.y + y.y) / 2);
}

// Threads write only the kept triangle and read only its mirror image (or
// their own diagonal entry), so no entry is both written and read by two
// threads.
template <typename T>
__global__ void SymmetrizeTriangleKernel(T* a, int64_t n, int64_t batch, bool lower) {
  const int64_t size = n * n;
  const Region kept = lower ? Region::kLower : Region::kUpper;
  for (int64_t b = blockIdx.x; b < batch; b += gridDim.x) {
    T* m = a + b * size;
    for (int64_t e = threadIdx.x; e < size; e += blockDim.x) {
      const int64_t i = e % n, j = e / n;
      if (InRegion(kept, i, j)) m[e] = Mean(m[e], Conj(m[i * n + j]));
    }
  }
}

template <typename T>
__global__ void FinishCholeskyKernel(T* a, int64_t n, int64_t batch, bool lower, int32_t* info) {
  const int64_t size = n * n;
  const Region kept = lower ? Region::kLower : Region::kUpper;
  for (int64_t b = blockIdx.x; b < batch; b += gridDim.x) {
    T* m = a + b * size;
    // info[b] is read by every thread before the barrier and written (by
    // thread 0) only after it, so `failed` is uniform across the block.
    int failed = info[b] != 0;
    if (!failed) {
      int bad = 0;
      for (int64_t e = threadIdx.x; e < size; e += blockDim.x) {
        if (InRegion(kept, e % n, e / n) && !Finite(m[e])) bad = 1;
      }
      failed = __syncthreads_or(bad);
      if (failed && threadIdx.x == 0) {
        int64_t column = n;
        for (int64_t j = 0; j < n; ++j) {
          if (!Finite(m[j * n + j])) {
            column = j + 1;
            break;
          }
        }
        info[b] = static_cast<int32_t>(column);
      }
    }
    for (int64_t e = threadIdx.x; e < size; e += blockDim.x) {
      if (failed) {
        m[e] = Scalar<T>::NaN();
      } else if (!InRegion(kept, e % n, e / n)) {
        m[e] = Scalar<T>::Zero();
      }
    }
    __syncthreads();
  }
}

__global__ void PivotsToPermutationKernel(int32_t* pivots, int64_t k, int32_t* perm, int64_t m,
                                          int64_t batch) {
  for (int64_t b = GlobalThread(); b < batch; b += GlobalStride()) {
    int32_t* piv = pivots + b * k;
    int32_t* p = perm + b * m;
    for (int64_t i = 0; i < m; ++i) p[i] = static_cast<int32_t>(i);
    for (int64_t i = 0; i < k; ++i) {
      const int32_t q = piv[i] - 1;
      piv[i] = q;
      if (q >= i && q < m) {
        const int32_t t = p[i];
        p[i] = p[q];
        p[q] = t;
      }
    }
  }
}

template <typename T>
__global__ void FinishDecompositionKernel(const int32_t* flags, int32_t* info, int64_t batch,
                                          GpuReal<T>* values, int64_t values_size, T* first,
                                          int64_t first_size, T* second, int64_t second_size) {
  for (int64_t b = blockIdx.x; b < batch; b += gridDim.x) {
    const int32_t status = flags[b] ? -4 : info[b];
    if (status == 0) continue;  // uniform across the block
    if (threadIdx.x == 0) info[b] = status;
    for (int64_t e = threadIdx.x; e < values_size; e += blockDim.x) {
      values[b * values_size + e] = Scalar<GpuReal<T>>::NaN();
    }
    if (first != nullptr) {
      for (int64_t e = threadIdx.x; e < first_size; e += blockDim.x) {
        first[b * first_size + e] = Scalar<T>::NaN();
      }
    }
    if (second != nullptr) {
      for (int64_t e = threadIdx.x; e < second_size; e += blockDim.x) {
        second[b * second_size + e] = Scalar<T>::NaN();
      }
    }
  }
}

template <typename T>
__global__ void FinishSolveKernel(const int32_t* a_info, BroadcastIndex index, int32_t* info, T* x,
                                  int64_t size, int64_t batch) {
  for (int64_t i = blockIdx.x; i < batch; i += gridDim.x) {
    const int32_t status = a_info[index(i)];
    if (threadIdx.x == 0) info[i] = status;
    if (status == 0) continue;
    for (int64_t e = threadIdx.x; e < size; e += blockDim.x) x[i * size + e] = Scalar<T>::NaN();
  }
}

}  // namespace

// ---- launchers ---------------------------------------------------------------

template <typename T>
cudaError_t MakePointers(cudaStream_t stream, T* base, int64_t stride, BroadcastIndex index,
                         int64_t count, T** ptrs) {
  if (count == 0) return cudaSuccess;
  MakePointersKernel<T><<<Blocks(count), kThreads, 0, stream>>>(base, stride, index, count, ptrs);
  return cudaGetLastError();
}

template <typename T>
cudaError_t BroadcastCopy(cudaStream_t stream, const T* src, int64_t elements, BroadcastIndex index,
                          int64_t count, T* dst) {
  const int64_t total = elements * count;
  if (total == 0) return cudaSuccess;
  BroadcastCopyKernel<T><<<Blocks(total), kThreads, 0, stream>>>(src, elements, index, total, dst);
  return cudaGetLastError();
}

template <typename T>
cudaError_t Conjugate(cudaStream_t stream, T* data, int64_t count) {
  if (count == 0) return cudaSuccess;
  ConjugateKernel<T><<<Blocks(count), kThreads, 0, stream>>>(data, count);
  return cudaGetLastError();
}

template <typename T>
cudaError_t CopyMatrix(cudaStream_t stream, const T* src, int64_t src_ld, int64_t src_stride,
                       T* dst, int64_t dst_ld, int64_t dst_stride, int64_t rows, int64_t cols,
                       int64_t batch, bool zero_below_diagonal) {
  const int64_t total = rows * cols * batch;
  if (total == 0) return cudaSuccess;
  CopyMatrixKernel<T><<<Blocks(total), kThreads, 0, stream>>>(
      src, src_ld, src_stride, dst, dst_ld, dst_stride, rows, cols, total, zero_below_diagonal);
  return cudaGetLastError();
}

template <typename T>
cudaError_t ConjugateTranspose(cudaStream_t stream, const T* src, int64_t src_ld,
                               int64_t src_stride, T* dst, int64_t dst_ld, int64_t dst_stride,
                               int64_t rows, int64_t cols, int64_t batch) {
  const int64_t total = rows * cols * batch;
  if (total == 0) return cudaSuccess;
  ConjugateTransposeKernel<T><<<Blocks(total), kThreads, 0, stream>>>(
      src, src_ld, src_stride, dst, dst_ld, dst_stride, rows, cols, total);
  return cudaGetLastError();
}

template <typename T>
cudaError_t FillIdentityColumns(cudaStream_t stream, T* dst, int64_t ld, int64_t stride,
                                int64_t rows, int64_t first_col, int64_t end_col, int64_t batch) {
  const int64_t cols = end_col - first_col, total = rows * cols * batch;
  if (cols <= 0 || total == 0) return cudaSuccess;
  FillIdentityColumnsKernel<T>
      <<<Blocks(total), kThreads, 0, stream>>>(dst, ld, stride, rows, first_col, cols, total);
  return cudaGetLastError();
}

template <typename T>
cudaError_t SanitizeNonFinite(cudaStream_t stream, T* a, int64_t rows, int64_t cols, int64_t batch,
                              Region region, int32_t* flags) {
  if (batch == 0) return cudaSuccess;
  SanitizeNonFiniteKernel<T>
      <<<Blocks(batch, 1), kThreads, 0, stream>>>(a, rows, cols, batch, region, flags);
  return cudaGetLastError();
}

template <typename T>
cudaError_t SymmetrizeTriangle(cudaStream_t stream, T* a, int64_t n, int64_t batch, bool lower) {
  if (batch == 0 || n == 0) return cudaSuccess;
  SymmetrizeTriangleKernel<T><<<Blocks(batch, 1), kThreads, 0, stream>>>(a, n, batch, lower);
  return cudaGetLastError();
}

template <typename T>
cudaError_t FinishCholesky(cudaStream_t stream, T* a, int64_t n, int64_t batch, bool lower,
                           int32_t* info) {
  if (batch == 0 || n == 0) return cudaSuccess;
  FinishCholeskyKernel<T><<<Blocks(batch, 1), kThreads, 0, stream>>>(a, n, batch, lower, info);
  return cudaGetLastError();
}

cudaError_t PivotsToPermutation(cudaStream_t stream, int32_t* pivots, int64_t k, int32_t* perm,
                                int64_t m, int64_t batch) {
  if (batch == 0 || m == 0) return cudaSuccess;
  PivotsToPermutationKernel<<<Blocks(batch, 64), 64, 0, stream>>>(pivots, k, perm, m, batch);
  return cudaGetLastError();
}

template <typename T>
cudaError_t FinishDecomposition(cudaStream_t stream, const int32_t* flags, int32_t* info,
                                int64_t batch, GpuReal<T>* values, int64_t values_size, T* first,
                                int64_t first_size, T* second, int64_t second_size) {
  if (batch == 0) return cudaSuccess;
  FinishDecompositionKernel<T><<<Blocks(batch, 1), kThreads, 0, stream>>>(
      flags, info, batch, values, values_size, first_size ? first : nullptr, first_size,
      second_size ? second : nullptr, second_size);
  return cudaGetLastError();
}

template <typename T>
cudaError_t FinishSolve(cudaStream_t stream, const int32_t* a_info, BroadcastIndex index,
                        int32_t* info, T* x, int64_t size, int64_t batch) {
  if (batch == 0) return cudaSuccess;
  FinishSolveKernel<T>
      <<<Blocks(batch, 1), kThreads, 0, stream>>>(a_info, index, info, x, size, batch);
  return cudaGetLastError();
}

// ---- instantiations ------------------------------------------------------------

#define BATCHPART_INSTANTIATE(T)                                                                  \
  template cudaError_t MakePointers<T>(cudaStream_t, T*, int64_t, BroadcastIndex, int64_t, T**);  \
  template cudaError_t BroadcastCopy<T>(cudaStream_t, const T*, int64_t, BroadcastIndex, int64_t, \
                                        T*);                                                      \
  template cudaError_t Conjugate<T>(cudaStream_t, T*, int64_t);                                   \
  template cudaError_t CopyMatrix<T>(cudaStream_t, const T*, int64_t, int64_t, T*, int64_t,       \
                                     int64_t, int64_t, int64_t, int64_t, bool);                   \
  template cudaError_t ConjugateTranspose<T>(cudaStream_t, const T*, int64_t, int64_t, T*,        \
                                             int64_t, int64_t, int64_t, int64_t, int64_t);        \
  template cudaError_t FillIdentityColumns<T>(cudaStream_t, T*, int64_t, int64_t, int64_t,        \
                                              int64_t, int64_t, int64_t);                         \
  template cudaError_t SanitizeNonFinite<T>(cudaStream_t, T*, int64_t, int64_t, int64_t, Region,  \
                                            int32_t*);                                            \
  template cudaError_t SymmetrizeTriangle<T>(cudaStream_t, T*, int64_t, int64_t, bool);           \
  template cudaError_t FinishCholesky<T>(cudaStream_t, T*, int64_t, int64_t, bool, int32_t*);     \
  template cudaError_t FinishDecomposition<T>(cudaStream_t, const int32_t*, int32_t*, int64_t,    \
                                              GpuReal<T>*, int64_t, T*, int64_t, T*, int64_t);    \
  template cudaError_t FinishSolve<T>(cudaStream_t, const int32_t*, BroadcastIndex, int32_t*, T*, \
                                      int64_t, int64_t);

BATCHPART_INSTANTIATE(float)
BATCHPART_INSTANTIATE(double)
BATCHPART_INSTANTIATE(cuComplex)
BATCHPART_INSTANTIATE(cuDoubleComplex)
#undef BATCHPART_INSTANTIATE

// Pivot arrays (int32) are broadcast for getrs.
template cudaError_t BroadcastCopy<int32_t>(cudaStream_t, const int32_t*, int64_t, BroadcastIndex,
                                            int64_t, int32_t*);

}  // namespace batchpart::cusolver
