// Offsets of broadcast operands in a batched kernel.
//
// batchpart broadcasts batch dims NumPy-style without materialising them: an
// operand with fewer batch dims, or with size-1 batch dims, reaches the kernel
// as it is. A kernel walks the output batch and asks, for each operand, which
// of its batch elements feeds output element i.
#ifndef BATCHPART_COMMON_BATCH_BROADCAST_H_
#define BATCHPART_COMMON_BATCH_BROADCAST_H_

#include <algorithm>
#include <cstdint>
#include <vector>

namespace batchpart {

class BatchBroadcast {
 public:
  // `out_batch` and `in_batch` are batch shapes (leading dims only); the
  // operand's are right-aligned against the output's. The caller has checked
  // that they broadcast.
  template <typename OutDims, typename InDims>
  BatchBroadcast(const OutDims& out_batch, const InDims& in_batch)
      : identity_(
            std::equal(out_batch.begin(), out_batch.end(), in_batch.begin(), in_batch.end())) {
    if (identity_) return;  // the common case: nothing to store or compute
    const size_t rank = out_batch.size();
    const size_t offset = rank - in_batch.size();
    out_dims_.assign(out_batch.begin(), out_batch.end());
    strides_.assign(rank, 0);
    int64_t stride = 1;
    for (size_t m = in_batch.size(); m-- > 0;) {
      if (in_batch[m] != 1) strides_[offset + m] = stride;
      stride *= in_batch[m];
    }
  }

  // The flat batch index of the operand element that feeds output element
  // `out_index` (flat, row-major over the output batch).
  int64_t operator()(int64_t out_index) const {
    if (identity_) return out_index;
    int64_t in_index = 0;
    for (size_t d = out_dims_.size(); d-- > 0;) {
      const int64_t i = out_index % out_dims_[d];
      out_index /= out_dims_[d];
      in_index += i * strides_[d];
    }
    return in_index;
  }

  // Whether a batch shape pair broadcasts (the operand's right-aligned dims
  // equal the output's or are 1).
  template <typename OutDims, typename InDims>
  static bool Broadcasts(const OutDims& out_batch, const InDims& in_batch) {
    if (in_batch.size() > out_batch.size()) return false;
    const size_t offset = out_batch.size() - in_batch.size();
    for (size_t m = 0; m < in_batch.size(); ++m) {
      if (in_batch[m] != 1 && in_batch[m] != out_batch[offset + m]) return false;
    }
    return true;
  }

 private:
  bool identity_;  // same batch shape: element i reads element i
  std::vector<int64_t> out_dims_;
  std::vector<int64_t> strides_;
};

}  // namespace batchpart

#endif  // BATCHPART_COMMON_BATCH_BROADCAST_H_
