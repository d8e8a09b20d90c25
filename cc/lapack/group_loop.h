// The batch loop of the small-matrix kernels: the batch in groups of
// kLanes<T> matrices (interleaved.h), whole groups per chunk of XLA's thread
// pool (batch_loop.h).
#ifndef BATCHPART_LAPACK_GROUP_LOOP_H_
#define BATCHPART_LAPACK_GROUP_LOOP_H_

#include <algorithm>
#include <cstdint>
#include <optional>

#include "lapack/batch_loop.h"
#include "lapack/interleaved.h"
#include "xla/ffi/api/ffi.h"

namespace batchpart::lapack::interleaved {

// One group's batch elements: [first, first + count), count <= kLanes<T>
// (less only in the batch's last group).
struct Lanes {
  int64_t first, count;
};

// Calls body(scratch, lanes) for every group of the batch, in order within
// each chunk; make_scratch() is called once per chunk for what its groups
// reuse (Group buffers, pivots). flops_per_matrix is one matrix's work: the
// pool sizes its chunks by work, and a group does kLanes<T> matrices'.
template <typename T, typename MakeScratch, typename Body>
xla::ffi::Error ForEachGroup(xla::ffi::ThreadPool& pool, int64_t batch, double flops_per_matrix,
                        const MakeScratch& make_scratch, const Body& body) {
  constexpr int64_t W = kLanes<T>;
  return ForEachBatchChunk(pool, (batch + W - 1) / W, W * flops_per_matrix,
                           [&](int64_t begin, int64_t end) {
                             auto scratch = make_scratch();
                             for (int64_t g = begin; g < end; ++g) {
                               body(scratch, Lanes{g * W, std::min(W, batch - g * W)});
                             }
                           });
}

// As ForEachGroup, for a kernel with a one-matrix twin that gives the same
// bits: group(group_scratch, lanes) runs each group of at least min_group
// matrices, one(one_scratch, lanes) each matrix of a smaller group (a short
// batch's only group, or a batch's last) with lanes = {b, 1}, which a padded
// group would charge a whole group's work. Each scratch is made once per
// chunk, when first needed.
template <typename T, typename MakeGroupScratch, typename GroupBody, typename MakeOneScratch,
          typename OneBody>
xla::ffi::Error ForEachGroupOrOne(xla::ffi::ThreadPool& pool, int64_t batch,
                                  double flops_per_matrix, int64_t min_group,
                                  const MakeGroupScratch& make_group_scratch,
                                  const GroupBody& group, const MakeOneScratch& make_one_scratch,
                                  const OneBody& one) {
  constexpr int64_t W = kLanes<T>;
  const auto run_groups = [&](int64_t begin, int64_t end) {
    std::optional<decltype(make_group_scratch())> group_scratch;
    std::optional<decltype(make_one_scratch())> one_scratch;
    for (int64_t g = begin; g < end; ++g) {
      const Lanes lanes{g * W, std::min(W, batch - g * W)};
      if (lanes.count >= min_group) {
        if (!group_scratch) group_scratch.emplace(make_group_scratch());
        group(*group_scratch, lanes);
        continue;
      }
      if (!one_scratch) one_scratch.emplace(make_one_scratch());
      for (int64_t b = lanes.first; b < lanes.first + lanes.count; ++b) {
        one(*one_scratch, Lanes{b, 1});
      }
    }
  };
  return ForEachBatchChunk(pool, (batch + W - 1) / W, W * flops_per_matrix, run_groups);
}

// The matrices of a group's lanes: out[l] = base + index(first + l) * size,
// index mapping a batch element to its operand's (a broadcast index, or the
// element itself).
template <typename P, typename Index>
void LanePointers(P* base, const Index& index, int64_t size, Lanes lanes, P** out) {
  for (int64_t l = 0; l < lanes.count; ++l) out[l] = base + index(lanes.first + l) * size;
}

// The index of an operand that is not broadcast.
inline int64_t Itself(int64_t b) { return b; }

// Packs into g the lanes' matrices of an operand: batch element b's at
// base + index(b) * size, read with strides s (with `lower`, only that
// triangle, as Group::PackTriangle). A group (W = kLanes<T>) or one matrix
// (W = 1, lanes = {b, 1}).
template <typename T, int W, typename Index>
void PackLanes(Group<T, W>& g, const T* base, const Index& index, int64_t size, Lanes lanes,
               Strides s) {
  const T* src[W];
  LanePointers(base, index, size, lanes, src);
  g.Pack(src, lanes.count, s);
}
template <typename T, int W, typename Index>
void PackTriangleLanes(Group<T, W>& g, const T* base, const Index& index, int64_t size, Lanes lanes,
                       Strides s, bool lower) {
  const T* src[W];
  LanePointers(base, index, size, lanes, src);
  g.PackTriangle(src, lanes.count, s, lower);
}

// Writes int32 lane rows (row i's W lanes at data + i * W, as a group keeps
// its pivots) to the lanes' batch elements of a result: element b's `rows`
// values at base + b * rows.
template <int W>
void UnpackIndexLanes(const int32_t* data, int64_t rows, int32_t* base, Lanes lanes) {
  int32_t* dst[W];
  LanePointers(base, Itself, rows, lanes, dst);
  UnpackIndices<W>(data, rows, lanes.count, dst);
}

// Writes g's lanes to the lanes' batch elements of a result: element b's at
// base + b * size, written with strides s.
template <typename T, int W>
void UnpackLanes(const Group<T, W>& g, T* base, int64_t size, Lanes lanes, Strides s) {
  T* dst[W];
  LanePointers(base, Itself, size, lanes, dst);
  g.Unpack(dst, lanes.count, s);
}

}  // namespace batchpart::lapack::interleaved

#endif  // BATCHPART_LAPACK_GROUP_LOOP_H_
