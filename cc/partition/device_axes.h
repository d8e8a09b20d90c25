// A sharding's device assignment viewed as a list of mesh axes, each tagged
// with what it tiles. The planner moves axes between tags (a core dim's axis
// onto a batch dim, or into replication) and then reads a Sharding back.
#ifndef BATCHPART_PARTITION_DEVICE_AXES_H_
#define BATCHPART_PARTITION_DEVICE_AXES_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "partition/planner.h"

namespace batchpart::partition {

struct Axis {
  enum class Tag { kBatch, kCore, kReplicated, kManual, kReduced };
  Tag tag;
  int index;  // batch dim (of the broadcast batch shape), core dim or reduction
  int64_t size;
};

class DeviceAxes {
 public:
  // The axes of a tiled sharding of an array whose first `batch_rank` dims
  // are batch dims, aligned to batch dim `batch_offset` of the batch shape.
  static DeviceAxes FromSharding(const Sharding& sharding, int batch_rank, int batch_offset);

  const std::vector<Axis>& axes() const { return axes_; }
  int64_t TagProduct(Axis::Tag tag, int index) const;

  // Splits axis `pos` into a major part of size `major` and the rest.
  void Split(int pos, int64_t major);
  // Retags axis `pos`, placing it after the last axis that already has the
  // new tag so that it becomes the minor factor of that dim.
  void Retag(int pos, Axis::Tag tag, int index);

  // Where an axis goes in the array being read back: data dim d >= 0, or
  // kToReplicated / kToManual.
  static constexpr int kToReplicated = -1;
  static constexpr int kToManual = -2;
  Sharding ToSharding(int rank, const std::function<int(const Axis&)>& slot) const;

  // The devices grouped by the axes `in_group` selects: one group per
  // combination of the other axes, each listing the devices that differ only
  // in the selected axes (row-major over them). Empty if none is selected.
  std::vector<std::vector<int64_t>> Groups(const std::function<bool(const Axis&)>& in_group) const;

 private:
  void Move(int from, int to);

  std::vector<Axis> axes_;
  std::vector<int64_t> devices_;  // row-major over axes_ sizes
};

}  // namespace batchpart::partition

#endif  // BATCHPART_PARTITION_DEVICE_AXES_H_
