#include "partition/device_axes.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>

namespace batchpart::partition {
namespace {

// Row-major transpose of `data` with shape `dims`: result axis k is input
// axis perm[k].
std::vector<int64_t> Transpose(const std::vector<int64_t>& data, const std::vector<int64_t>& dims,
                               const std::vector<int>& perm) {
  const size_t rank = dims.size();
  std::vector<int64_t> in_strides(rank, 1);
  for (int i = static_cast<int>(rank) - 2; i >= 0; --i) {
    in_strides[i] = in_strides[i + 1] * dims[i + 1];
  }
  std::vector<int64_t> out_dims(rank), out_strides(rank);
  for (size_t k = 0; k < rank; ++k) {
    out_dims[k] = dims[perm[k]];
    out_strides[k] = in_strides[perm[k]];
  }
  std::vector<int64_t> out(data.size());
  std::vector<int64_t> index(rank, 0);
  for (size_t flat = 0; flat < data.size(); ++flat) {
    int64_t offset = 0;
    for (size_t k = 0; k < rank; ++k) offset += index[k] * out_strides[k];
    out[flat] = data[offset];
    for (int k = static_cast<int>(rank) - 1; k >= 0; --k) {
      if (++index[k] < out_dims[k]) break;
      index[k] = 0;
    }
  }
  return out;
}

}  // namespace

DeviceAxes DeviceAxes::FromSharding(const Sharding& sharding, int batch_rank, int batch_offset) {
  DeviceAxes result;
  const int rank = static_cast<int>(sharding.tile_dims.size());
  for (int d = 0; d < rank; ++d) {
    if (d < batch_rank) {
      result.axes_.push_back({Axis::Tag::kBatch, d + batch_offset, sharding.tile_dims[d]});
    } else {
      result.axes_.push_back({Axis::Tag::kCore, d - batch_rank, sharding.tile_dims[d]});
    }
  }
  for (size_t g = 0; g < sharding.subgroup_dims.size(); ++g) {
    const Axis::Tag tag = sharding.subgroup_kinds[g] == Sharding::Subgroup::kManual
                              ? Axis::Tag::kManual
                              : Axis::Tag::kReplicated;
    result.axes_.push_back({tag, 0, sharding.subgroup_dims[g]});
  }
  result.devices_ = sharding.devices;
  return result;
}

int64_t DeviceAxes::TagProduct(Axis::Tag tag, int index) const {
  int64_t product = 1;
  for (const Axis& axis : axes_) {
    if (axis.tag == tag && axis.index == index) product *= axis.size;
  }
  return product;
}

void DeviceAxes::Split(int pos, int64_t major) {
  Axis& axis = axes_[pos];
  if (major <= 0 || axis.size % major != 0) {
    throw std::invalid_argument("cannot split a mesh axis of size " + std::to_string(axis.size) +
                                " by " + std::to_string(major));
  }
  Axis minor = axis;
  minor.size = axis.size / major;
  axis.size = major;
  // Row-major: splitting one axis into (major, minor) leaves devices as is.
  axes_.insert(axes_.begin() + pos + 1, minor);
}

void DeviceAxes::Move(int from, int to) {
  if (from == to) return;
  std::vector<int> perm(axes_.size());
  std::iota(perm.begin(), perm.end(), 0);
  perm.erase(perm.begin() + from);
  perm.insert(perm.begin() + to, from);
  std::vector<int64_t> dims;
  for (const Axis& axis : axes_) dims.push_back(axis.size);
  devices_ = Transpose(devices_, dims, perm);
  Axis moved = axes_[from];
  axes_.erase(axes_.begin() + from);
  axes_.insert(axes_.begin() + to, moved);
}

void DeviceAxes::Retag(int pos, Axis::Tag tag, int index) {
  int last = -1;
  for (int i = 0; i < static_cast<int>(axes_.size()); ++i) {
    if (i != pos && axes_[i].tag == tag && axes_[i].index == index) last = i;
  }
  axes_[pos].tag = tag;
  axes_[pos].index = index;
  if (last < 0) return;
  // Moving `pos` to just after `last` (indices shift when pos < last).
  Move(pos, pos < last ? last : last + 1);
}

Sharding DeviceAxes::ToSharding(int rank, const std::function<int(const Axis&)>& slot) const {
  // Slot order: data dims 0..rank-1, then manual, then replicated (XLA's
  // canonical order of subgroup types).
  auto order = [&](const Axis& axis) {
    const int s = slot(axis);
    if (s == kToManual) return rank;
    if (s == kToReplicated) return rank + 1;
    return s;
  };
  std::vector<int> perm(axes_.size());
  std::iota(perm.begin(), perm.end(), 0);
  std::stable_sort(perm.begin(), perm.end(),
                   [&](int a, int b) { return order(axes_[a]) < order(axes_[b]); });
  std::vector<int64_t> dims;
  for (const Axis& axis : axes_) dims.push_back(axis.size);

  Sharding out;
  out.kind = Sharding::Kind::kTiled;
  out.tile_dims.assign(rank, 1);
  int64_t replicated = 1, manual = 1;
  for (const Axis& axis : axes_) {
    const int o = order(axis);
    if (o < rank) {
      out.tile_dims[o] *= axis.size;
    } else if (o == rank) {
      manual *= axis.size;
    } else {
      replicated *= axis.size;
    }
  }
  const bool all_replicated = manual == 1 && std::all_of(out.tile_dims.begin(), out.tile_dims.end(),
                                                         [](int64_t t) { return t == 1; });
  if (all_replicated) return Sharding::Replicated();
  if (manual > 1) {
    out.subgroup_dims.push_back(manual);
    out.subgroup_kinds.push_back(Sharding::Subgroup::kManual);
  }
  if (replicated > 1) {
    out.subgroup_dims.push_back(replicated);
    out.subgroup_kinds.push_back(Sharding::Subgroup::kReplicated);
  }
  out.devices = Transpose(devices_, dims, perm);
  return out;
}

std::vector<std::vector<int64_t>> DeviceAxes::Groups(
    const std::function<bool(const Axis&)>& in_group) const {
  // Selected axes last, so each group is a contiguous run of the transpose.
  std::vector<int> perm, selected;
  int64_t group_size = 1;
  for (int i = 0; i < static_cast<int>(axes_.size()); ++i) {
    if (in_group(axes_[i])) {
      selected.push_back(i);
      group_size *= axes_[i].size;
    } else {
      perm.push_back(i);
    }
  }
  if (selected.empty()) return {};
  perm.insert(perm.end(), selected.begin(), selected.end());
  std::vector<int64_t> dims;
  for (const Axis& axis : axes_) dims.push_back(axis.size);
  const std::vector<int64_t> ordered = Transpose(devices_, dims, perm);
  std::vector<std::vector<int64_t>> groups;
  for (size_t start = 0; start < ordered.size(); start += group_size) {
    groups.emplace_back(ordered.begin() + start, ordered.begin() + start + group_size);
  }
  return groups;
}

}  // namespace batchpart::partition
