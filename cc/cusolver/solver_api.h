// Shared pieces of the CUDA kernels: cuSOLVER/cuBLAS entry points per scalar
// type, status checks that name the target, handle pools, scratch memory from
// XLA's FFI allocator, dtype dispatch and broadcast maps.
//
// Validation and messages are every platform's (common/contracts.h,
// common/ffi_helpers.h), so a malformed call gets the same message on the
// CPU and the GPU.
#ifndef BATCHPART_CUSOLVER_SOLVER_API_H_
#define BATCHPART_CUSOLVER_SOLVER_API_H_

#include <cuComplex.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cusolverDn.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "common/ffi_helpers.h"
#include "cusolver/device_kernels.h"
#include "xla/ffi/api/ffi.h"

namespace batchpart::cusolver {

// ---- per-type entry points ---------------------------------------------------

// Solver<T> holds the cuSOLVER and cuBLAS routines for T (float, double,
// cuComplex, cuDoubleComplex) under one name; where real and complex differ
// (orgqr/ungqr, syevd/heevd, syevj/heevj) the table holds the one for T.
template <typename T>
struct Solver;

// A routine that sizes its workspace first: `name` and `name`_bufferSize.
#define BATCHPART_SOLVER_ROUTINE(name, routine)                    \
  static constexpr auto name##_bufferSize = &routine##_bufferSize; \
  static constexpr auto name = &routine;

#define BATCHPART_SOLVER_TABLE(T, R, P, SY, OR)                           \
  template <>                                                             \
  struct Solver<T> {                                                      \
    using Real = R;                                                       \
    BATCHPART_SOLVER_ROUTINE(potrf, cusolverDn##P##potrf)                 \
    static constexpr auto potrfBatched = &cusolverDn##P##potrfBatched;    \
    BATCHPART_SOLVER_ROUTINE(getrf, cusolverDn##P##getrf)                 \
    static constexpr auto getrs = &cusolverDn##P##getrs;                  \
    BATCHPART_SOLVER_ROUTINE(geqrf, cusolverDn##P##geqrf)                 \
    BATCHPART_SOLVER_ROUTINE(orgqr, cusolverDn##P##OR##gqr)               \
    BATCHPART_SOLVER_ROUTINE(syevd, cusolverDn##P##SY##evd)               \
    BATCHPART_SOLVER_ROUTINE(syevjBatched, cusolverDn##P##SY##evjBatched) \
    BATCHPART_SOLVER_ROUTINE(gesvd, cusolverDn##P##gesvd)                 \
    BATCHPART_SOLVER_ROUTINE(gesvdjBatched, cusolverDn##P##gesvdjBatched) \
    static constexpr auto trsm = &cublas##P##trsm_v2;                     \
    static constexpr auto trsmBatched = &cublas##P##trsmBatched;          \
    static constexpr auto getrfBatched = &cublas##P##getrfBatched;        \
    static constexpr auto getrsBatched = &cublas##P##getrsBatched;        \
  };

BATCHPART_SOLVER_TABLE(float, float, S, sy, or)
BATCHPART_SOLVER_TABLE(double, double, D, sy, or)
BATCHPART_SOLVER_TABLE(cuComplex, float, C, he, un)
BATCHPART_SOLVER_TABLE(cuDoubleComplex, double, Z, he, un)
#undef BATCHPART_SOLVER_TABLE
#undef BATCHPART_SOLVER_ROUTINE

template <typename T>
inline constexpr bool kIsComplex =
    std::is_same_v<T, cuComplex> || std::is_same_v<T, cuDoubleComplex>;

template <typename T>
T HostOne() {
  if constexpr (std::is_same_v<T, cuComplex>) {
    return make_cuComplex(1.0f, 0.0f);
  } else if constexpr (std::is_same_v<T, cuDoubleComplex>) {
    return make_cuDoubleComplex(1.0, 0.0);
  } else {
    return T(1);
  }
}

// cuSOLVER's scalar types: its own complex types in place of std::complex.
struct CudaScalars {
  using F32 = float;
  using F64 = double;
  using C64 = cuComplex;
  using C128 = cuDoubleComplex;
};

// Calls fn(TypeTag<T>{}) with T the cuSOLVER type of `dtype`.
template <typename Fn>
ffi::Error DispatchByDtype(const char* target, ffi::DataType dtype, Fn&& fn) {
  return batchpart::DispatchByDtype<CudaScalars>(target, dtype, std::forward<Fn>(fn));
}

// ---- status checks (solver_api.cc) -------------------------------------------

ffi::Error CudaStatus(const char* target, const char* what, cudaError_t status);
ffi::Error SolverStatus(const char* target, const char* what, cusolverStatus_t status);
ffi::Error BlasStatus(const char* target, const char* what, cublasStatus_t status);

// ---- handles -------------------------------------------------------------------

// A cuSOLVER or cuBLAS handle borrowed from a per-stream pool and bound to
// the stream; returned to the pool when the lease goes out of scope. Handles
// are created on first use (with the caller's current device, which XLA
// sets) and live as long as the process.
void ReturnHandle(cudaStream_t stream, cusolverDnHandle_t handle);
void ReturnHandle(cudaStream_t stream, cublasHandle_t handle);

template <typename Handle>
class HandleLease {
 public:
  HandleLease() = default;
  HandleLease(cudaStream_t stream, Handle handle) : stream_(stream), handle_(handle) {}
  HandleLease(HandleLease&& other) noexcept
      : stream_(other.stream_), handle_(std::exchange(other.handle_, nullptr)) {}
  HandleLease& operator=(HandleLease&& other) noexcept {
    if (this != &other) {
      Release();
      stream_ = other.stream_;
      handle_ = std::exchange(other.handle_, nullptr);
    }
    return *this;
  }
  HandleLease(const HandleLease&) = delete;
  HandleLease& operator=(const HandleLease&) = delete;
  ~HandleLease() { Release(); }

  Handle get() const { return handle_; }

 private:
  void Release() {
    if (handle_ != nullptr) ReturnHandle(stream_, std::exchange(handle_, nullptr));
  }

  cudaStream_t stream_ = nullptr;
  Handle handle_ = nullptr;
};

using SolverHandle = HandleLease<cusolverDnHandle_t>;
using BlasHandle = HandleLease<cublasHandle_t>;

ffi::Error BorrowSolver(const char* target, cudaStream_t stream, SolverHandle* out);
ffi::Error BorrowBlas(const char* target, cudaStream_t stream, BlasHandle* out);

// ---- scratch memory ------------------------------------------------------------

// `count` elements of T from XLA's scratch allocator (freed when the handler
// returns; XLA orders the reuse after the work queued on this stream). A zero
// count gives nullptr without allocating.
template <typename T>
ffi::Error Allocate(ffi::ScratchAllocator& scratch, const char* target, const char* what,
                    int64_t count, T** out) {
  *out = nullptr;
  if (count <= 0) return ffi::Error::Success();
  std::optional<void*> memory = scratch.Allocate(static_cast<size_t>(count) * sizeof(T));
  if (!memory.has_value() || *memory == nullptr) {
    return ffi::Error(ffi::ErrorCode::kResourceExhausted,
                      std::string(target) + ": could not allocate " +
                          std::to_string(count * sizeof(T)) + " bytes of device scratch for " +
                          what);
  }
  *out = static_cast<T*>(*memory);
  return ffi::Error::Success();
}

// A buffer's data as T* (the FFI's complex types are layout-compatible with
// cuComplex/cuDoubleComplex).
template <typename T>
T* Data(const ffi::AnyBuffer& buffer) {
  return static_cast<T*>(buffer.untyped_data());
}

// Sets `count` int32 values to 0.
inline ffi::Error ZeroInts(const char* target, cudaStream_t stream, int32_t* data, int64_t count) {
  if (count == 0) return ffi::Error::Success();
  return CudaStatus(target, "cudaMemsetAsync",
                    cudaMemsetAsync(data, 0, static_cast<size_t>(count) * sizeof(int32_t), stream));
}

// Copies `count` elements device-to-device unless the buffers are one (an
// aliased operand and result).
template <typename T>
ffi::Error CopyIfDistinct(const char* target, cudaStream_t stream, const T* src, T* dst,
                          int64_t count) {
  if (src == dst || count == 0) return ffi::Error::Success();
  return CudaStatus(target, "cudaMemcpyAsync",
                    cudaMemcpyAsync(dst, src, static_cast<size_t>(count) * sizeof(T),
                                    cudaMemcpyDeviceToDevice, stream));
}

// The parameters of a Jacobi solver (syevjInfo_t, gesvdjInfo_t), destroyed
// with their scope.
template <typename Info, cusolverStatus_t (*Destroy)(Info)>
struct JacobiParams {
  JacobiParams() = default;
  JacobiParams(const JacobiParams&) = delete;
  JacobiParams& operator=(const JacobiParams&) = delete;
  ~JacobiParams() {
    if (params != nullptr) Destroy(params);
  }
  Info params = nullptr;
};

// ---- broadcasting --------------------------------------------------------------

// The device map from the output batch (out_batch) to an operand's batch
// elements (in_batch, right-aligned, size-1 dims broadcast). Dims of size 1
// are dropped and adjacent dims merged where the operand's strides allow, so
// that the map fits kMaxBroadcastRank; INVALID_ARGUMENT if it does not.
ffi::Error MakeBroadcastIndex(const char* target, const char* what, Dims out_batch, Dims in_batch,
                              BroadcastIndex* index);
// The identity map over `count` elements.
BroadcastIndex IdentityIndex(int64_t count);
// An operand's map: the identity where its batch has `count` elements (the
// output's), else MakeBroadcastIndex's.
ffi::Error OperandIndex(const char* target, const char* what, Dims operand_batch, Dims out_batch,
                        int64_t count, BroadcastIndex* index);

// Fills `count` output matrices of `size` elements with operand b's: one
// copy where b's batch is the output's, else through b's broadcast map.
template <typename T>
ffi::Error CopyBroadcast(const char* target, cudaStream_t stream, const T* b, Dims b_batch,
                         const BroadcastIndex& b_index, int64_t count, int64_t size, T* x) {
  if (Product(b_batch) == count) return CopyIfDistinct(target, stream, b, x, count * size);
  return CudaStatus(target, "BroadcastCopy", BroadcastCopy(stream, b, size, b_index, count, x));
}

// x holding operand b broadcast over the output batch (`count` matrices of
// `x_size`), and `a_index`, operand a's map onto that batch: the start of a
// solve. Shape: a_batch, b_batch, x_batch (TrsmShape, GesvShape).
template <typename T, typename Shape>
ffi::Error BroadcastOperands(const char* target, cudaStream_t stream, const Shape& shape,
                             int64_t count, const T* b, int64_t x_size, T* x,
                             BroadcastIndex* a_index) {
  BroadcastIndex b_index;
  BATCHPART_RETURN_IF_ERROR(
      OperandIndex(target, "operand a", shape.a_batch, shape.x_batch, count, a_index));
  BATCHPART_RETURN_IF_ERROR(
      OperandIndex(target, "operand b", shape.b_batch, shape.x_batch, count, &b_index));
  return CopyBroadcast(target, stream, b, shape.b_batch, b_index, count, x_size, x);
}

// A device array of `count` pointers for cuSOLVER/cuBLAS batched routines:
// the i-th to the matrix of `size` elements at data + index(i) * size.
template <typename T>
ffi::Error PointerArray(ffi::ScratchAllocator& scratch, const char* target, cudaStream_t stream,
                        T* data, int64_t size, const BroadcastIndex& index, int64_t count,
                        T*** ptrs) {
  BATCHPART_RETURN_IF_ERROR(Allocate(scratch, target, "pointer array", count, ptrs));
  return CudaStatus(target, "MakePointers", MakePointers(stream, data, size, index, count, *ptrs));
}

// A cuSOLVER routine called once per matrix with one device workspace:
// query(&lwork) is its _bufferSize call, run(i, work, lwork) its call on
// matrix i of `count`. Errors name `routine` ("potrf") and the target.
template <typename T, typename Query, typename Run>
ffi::Error ForEachMatrix(ffi::ScratchAllocator& scratch, const char* target, const char* routine,
                         int64_t count, Query&& query, Run&& run) {
  const std::string name(routine);
  int lwork = 0;
  BATCHPART_RETURN_IF_ERROR(SolverStatus(target, (name + "_bufferSize").c_str(), query(&lwork)));
  T* work;
  BATCHPART_RETURN_IF_ERROR(Allocate(scratch, target, (name + " workspace").c_str(), lwork, &work));
  for (int64_t i = 0; i < count; ++i) {
    BATCHPART_RETURN_IF_ERROR(SolverStatus(target, routine, run(i, work, lwork)));
  }
  return ffi::Error::Success();
}

// cuSOLVER/cuBLAS batched calls take an int batch count; this walks [0,
// total) in chunks that fit.
template <typename Fn>
ffi::Error ForEachBatchChunk(int64_t total, Fn&& fn) {
  constexpr int64_t kChunk = std::numeric_limits<int>::max();
  for (int64_t begin = 0; begin < total; begin += kChunk) {
    BATCHPART_RETURN_IF_ERROR(fn(begin, static_cast<int>(std::min(kChunk, total - begin))));
  }
  return ffi::Error::Success();
}

// The binding every CUDA handler starts from: its stream and XLA's scratch
// allocator, the first two arguments of each handler, which then binds its
// target's operands (common/contracts.h's Bind*).
inline auto BindCuda() {
  return ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>().Ctx<ffi::ScratchAllocator>();
}

// Whether a batch goes to a batched routine (one call, pointer arrays) or to
// a loop of per-matrix calls: batched when there are enough matrices for
// their size. This is jaxlib's rule for LU (batch > 1 && n / batch <= 128);
// batchpart applies it to potrfBatched, getrfBatched and getrsBatched alike.
inline bool UseBatched(int64_t n, int64_t batch) { return batch > 1 && n / batch <= 128; }

// The largest matrices cuSOLVER's Jacobi batched routines take
// (syevjBatched and gesvdjBatched require n <= 32).
inline constexpr int64_t kSmallMatrix = 32;

}  // namespace batchpart::cusolver

#endif  // BATCHPART_CUSOLVER_SOLVER_API_H_
