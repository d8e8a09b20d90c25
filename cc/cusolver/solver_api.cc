#include "cusolver/solver_api.h"

#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace batchpart::cusolver {
namespace {

const char* SolverStatusName(cusolverStatus_t status) {
  switch (status) {
    case CUSOLVER_STATUS_SUCCESS:
      return "CUSOLVER_STATUS_SUCCESS";
    case CUSOLVER_STATUS_NOT_INITIALIZED:
      return "CUSOLVER_STATUS_NOT_INITIALIZED";
    case CUSOLVER_STATUS_ALLOC_FAILED:
      return "CUSOLVER_STATUS_ALLOC_FAILED";
    case CUSOLVER_STATUS_INVALID_VALUE:
      return "CUSOLVER_STATUS_INVALID_VALUE";
    case CUSOLVER_STATUS_ARCH_MISMATCH:
      return "CUSOLVER_STATUS_ARCH_MISMATCH";
    case CUSOLVER_STATUS_EXECUTION_FAILED:
      return "CUSOLVER_STATUS_EXECUTION_FAILED";
    case CUSOLVER_STATUS_INTERNAL_ERROR:
      return "CUSOLVER_STATUS_INTERNAL_ERROR";
    case CUSOLVER_STATUS_NOT_SUPPORTED:
      return "CUSOLVER_STATUS_NOT_SUPPORTED";
    default:
      return "cusolverStatus_t";
  }
}

// Pools of handles per stream. XLA keeps a handful of long-lived streams, so
// the pools stay small. Allocated once and never destroyed: destroying
// handles during interpreter shutdown, after the CUDA context may be gone,
// is what jaxlib avoids too.
template <typename Handle>
struct Pool {
  std::mutex mu;
  std::unordered_map<cudaStream_t, std::vector<Handle>> free;

  static Pool& Get() {
    static Pool* pool = new Pool();
    return *pool;
  }

  // A handle for `stream` from the pool, or nullptr.
  Handle Take(cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mu);
    std::vector<Handle>& handles = free[stream];
    if (handles.empty()) return nullptr;
    Handle handle = handles.back();
    handles.pop_back();
    return handle;
  }

  void Put(cudaStream_t stream, Handle handle) {
    std::lock_guard<std::mutex> lock(mu);
    free[stream].push_back(handle);
  }
};

}  // namespace

ffi::Error CudaStatus(const char* target, const char* what, cudaError_t status) {
  if (status == cudaSuccess) return ffi::Error::Success();
  return ffi::Error::Internal(std::string(target) + ": " + what + " failed: " +
                              cudaGetErrorName(status) + " (" + cudaGetErrorString(status) + ")");
}

ffi::Error SolverStatus(const char* target, const char* what, cusolverStatus_t status) {
  if (status == CUSOLVER_STATUS_SUCCESS) return ffi::Error::Success();
  return ffi::Error::Internal(std::string(target) + ": cuSOLVER " + what +
                              " failed: " + SolverStatusName(status) + " (" +
                              std::to_string(static_cast<int>(status)) + ")");
}

ffi::Error BlasStatus(const char* target, const char* what, cublasStatus_t status) {
  if (status == CUBLAS_STATUS_SUCCESS) return ffi::Error::Success();
  return ffi::Error::Internal(std::string(target) + ": cuBLAS " + what +
                              " failed: " + cublasGetStatusName(status) + " (" +
                              cublasGetStatusString(status) + ")");
}

void ReturnHandle(cudaStream_t stream, cusolverDnHandle_t handle) {
  Pool<cusolverDnHandle_t>::Get().Put(stream, handle);
}

void ReturnHandle(cudaStream_t stream, cublasHandle_t handle) {
  Pool<cublasHandle_t>::Get().Put(stream, handle);
}

ffi::Error BorrowSolver(const char* target, cudaStream_t stream, SolverHandle* out) {
  cusolverDnHandle_t handle = Pool<cusolverDnHandle_t>::Get().Take(stream);
  if (handle == nullptr) {
    BATCHPART_RETURN_IF_ERROR(SolverStatus(target, "cusolverDnCreate", cusolverDnCreate(&handle)));
  }
  // Leased before binding, so that a failure returns it to the pool.
  SolverHandle lease(stream, handle);
  BATCHPART_RETURN_IF_ERROR(
      SolverStatus(target, "cusolverDnSetStream", cusolverDnSetStream(handle, stream)));
  *out = std::move(lease);
  return ffi::Error::Success();
}

ffi::Error BorrowBlas(const char* target, cudaStream_t stream, BlasHandle* out) {
  cublasHandle_t handle = Pool<cublasHandle_t>::Get().Take(stream);
  if (handle == nullptr) {
    BATCHPART_RETURN_IF_ERROR(BlasStatus(target, "cublasCreate", cublasCreate(&handle)));
  }
  BlasHandle lease(stream, handle);
  BATCHPART_RETURN_IF_ERROR(BlasStatus(target, "cublasSetStream", cublasSetStream(handle, stream)));
  *out = std::move(lease);
  return ffi::Error::Success();
}

ffi::Error MakeBroadcastIndex(const char* target, const char* what, Dims out_batch, Dims in_batch,
                              BroadcastIndex* index) {
  // The operand's stride for every output dim (0 where it is broadcast),
  // as cc/common/batch_broadcast.h computes it.
  const size_t rank = out_batch.size(), offset = rank - in_batch.size();
  std::vector<int64_t> strides(rank, 0);
  int64_t stride = 1;
  for (size_t m = in_batch.size(); m-- > 0;) {
    if (in_batch[m] != 1) strides[offset + m] = stride;
    stride *= in_batch[m];
  }
  // Drop size-1 output dims; merge dim d into the kept dim before it when
  // the operand walks both as one (stride[prev] == stride[d] * dim[d],
  // which covers two broadcast dims too).
  std::vector<int64_t> dims, kept;
  for (size_t d = 0; d < rank; ++d) {
    if (out_batch[d] == 1) continue;
    if (!dims.empty() && kept.back() == strides[d] * out_batch[d]) {
      dims.back() *= out_batch[d];
      kept.back() = strides[d];
    } else {
      dims.push_back(out_batch[d]);
      kept.push_back(strides[d]);
    }
  }
  if (dims.size() > static_cast<size_t>(kMaxBroadcastRank)) {
    return InvalidArgument(target, std::string("the broadcast of ") + what + "'s batch dims " +
                                       DimsToString(in_batch) + " over " + DimsToString(out_batch) +
                                       " needs more than " + std::to_string(kMaxBroadcastRank) +
                                       " dims on the GPU; reshape the batch dims");
  }
  *index = BroadcastIndex{};
  index->rank = static_cast<int>(dims.size());
  for (size_t d = 0; d < dims.size(); ++d) {
    index->dims[d] = dims[d];
    index->strides[d] = kept[d];
  }
  return ffi::Error::Success();
}

ffi::Error OperandIndex(const char* target, const char* what, Dims operand_batch, Dims out_batch,
                        int64_t count, BroadcastIndex* index) {
  if (Product(operand_batch) == count) {
    *index = IdentityIndex(count);
    return ffi::Error::Success();
  }
  return MakeBroadcastIndex(target, what, out_batch, operand_batch, index);
}

BroadcastIndex IdentityIndex(int64_t count) {
  BroadcastIndex index;
  index.rank = 1;
  index.dims[0] = count > 0 ? count : 1;
  index.strides[0] = 1;
  return index;
}

}  // namespace batchpart::cusolver
