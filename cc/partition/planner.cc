#include "partition/planner.h"

#include <algorithm>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <unordered_set>

#include "common/dims_string.h"
#include "partition/device_axes.h"

namespace batchpart::partition {
namespace {

using Tag = Axis::Tag;

[[noreturn]] void Invalid(const std::string& what, size_t index, const std::string& message) {
  throw std::invalid_argument(what + " " + std::to_string(index) + ": " + message);
}

void ValidateSharding(const Sharding& sharding, const Shape& shape, const std::string& what,
                      size_t index) {
  if (sharding.kind == Sharding::Kind::kMaximal && sharding.devices.size() != 1) {
    Invalid(what, index, "a maximal sharding names exactly one device");
  }
  if (sharding.kind != Sharding::Kind::kTiled) return;
  if (sharding.tile_dims.size() != shape.size()) {
    Invalid(what, index,
            "sharding has " + std::to_string(sharding.tile_dims.size()) +
                " tile dims for an array of shape " + DimsToString(shape));
  }
  if (sharding.subgroup_dims.size() != sharding.subgroup_kinds.size()) {
    Invalid(what, index, "subgroup dims and subgroup kinds differ in number");
  }
  for (int64_t t : sharding.tile_dims) {
    if (t < 1) Invalid(what, index, "tile counts must be positive");
  }
  for (int64_t t : sharding.subgroup_dims) {
    if (t < 1) Invalid(what, index, "subgroup sizes must be positive");
  }
  if (static_cast<int64_t>(sharding.devices.size()) != sharding.NumTiles()) {
    Invalid(what, index,
            "device list has " + std::to_string(sharding.devices.size()) + " entries for " +
                std::to_string(sharding.NumTiles()) + " tiles");
  }
  std::unordered_set<int64_t> seen;
  for (int64_t d : sharding.devices) {
    if (d < 0 || !seen.insert(d).second) {
      Invalid(what, index, "device list must hold distinct non-negative ids");
    }
  }
}

void ValidateArrays(const std::vector<Shape>& shapes, const std::vector<int>& batch_ranks,
                    const std::vector<Sharding>& shardings, bool shardings_optional,
                    const std::string& what) {
  if (batch_ranks.size() != shapes.size()) {
    throw std::invalid_argument("one batch rank per " + what + " is required");
  }
  if (!(shardings.size() == shapes.size() || (shardings_optional && shardings.empty()))) {
    throw std::invalid_argument("one sharding per " + what + " is required");
  }
  for (size_t i = 0; i < shapes.size(); ++i) {
    for (int64_t d : shapes[i]) {
      if (d < 0) Invalid(what, i, "negative dimension in " + DimsToString(shapes[i]));
    }
    if (batch_ranks[i] < 0 || batch_ranks[i] > static_cast<int>(shapes[i].size())) {
      Invalid(what, i,
              "batch rank " + std::to_string(batch_ranks[i]) + " does not fit shape " +
                  DimsToString(shapes[i]));
    }
    if (!shardings.empty()) ValidateSharding(shardings[i], shapes[i], what, i);
  }
}

// The reduced-dim table of one operand or result (empty: none), checked
// against its shape: one entry per dim, -1 on batch dims.
const std::vector<int>& ReducedDims(const std::vector<std::vector<int>>& table, size_t k) {
  static const std::vector<int> kNone;
  if (table.empty() || table[k].empty()) return kNone;
  return table[k];
}

void ValidateReducedTable(const std::vector<std::vector<int>>& table,
                          const std::vector<Shape>& shapes, const std::vector<int>& batch_ranks,
                          const std::string& what) {
  if (table.empty()) return;
  if (table.size() != shapes.size()) {
    throw std::invalid_argument("one reduced-dim list per " + what + " is required");
  }
  for (size_t k = 0; k < table.size(); ++k) {
    if (table[k].empty()) continue;
    if (table[k].size() != shapes[k].size()) {
      Invalid(what, k, "reduced-dim list does not have one entry per dim");
    }
    for (size_t d = 0; d < table[k].size(); ++d) {
      const bool batch = static_cast<int>(d) < batch_ranks[k];
      if (table[k][d] < -1 || (batch && table[k][d] != -1)) {
        Invalid(what, k, "dim " + std::to_string(d) + " cannot be a reduced dim");
      }
    }
  }
}

void ValidateReducedDims(const Problem& problem) {
  ValidateReducedTable(problem.operand_reduced_dims, problem.operand_shapes,
                       problem.operand_batch_ranks, "operand");
  ValidateReducedTable(problem.result_reduced_dims, problem.result_shapes,
                       problem.result_batch_ranks, "result");
  for (int64_t m : problem.reduced_min_parts) {
    if (m < 1) throw std::invalid_argument("a reduced dim's smallest part must be positive");
  }
}

// Whether batch dim `i` of the batch shape is a real (not broadcast) dim of
// an array with `batch_rank` batch dims.
bool HasBatchDim(const Shape& shape, int batch_rank, const Shape& batch_shape, int i) {
  const int m = i - (static_cast<int>(batch_shape.size()) - batch_rank);
  if (m < 0) return false;
  return !(shape[m] == 1 && batch_shape[i] != 1);
}

// One way to shard the batch, read off one array's sharding.
struct Candidate {
  DeviceAxes axes;
  int64_t batch_tiles = 1;
  int64_t reduce_tiles = 1;
  std::vector<int> uneven_reductions;
};


// Position of the first axis satisfying `pred`, or -1.
template <typename Pred>
int FindAxis(const DeviceAxes& axes, Pred pred) {
  for (int pos = 0; pos < static_cast<int>(axes.axes().size()); ++pos) {
    if (pred(axes.axes()[pos])) return pos;
  }
  return -1;
}

// The largest factor of `size` (> 1) that some batch dim of this array can
// still absorb evenly, with that dim.
std::optional<std::pair<int64_t, int>> Placement(const DeviceAxes& axes, int64_t size,
                                                 const Shape& shape, int batch_rank,
                                                 const Shape& batch_shape, bool split_axes) {
  for (int64_t f = size; f > (split_axes ? 1 : size - 1); --f) {
    if (size % f != 0) continue;
    for (int i = 0; i < static_cast<int>(batch_shape.size()); ++i) {
      if (!HasBatchDim(shape, batch_rank, batch_shape, i)) continue;
      if (batch_shape[i] % (axes.TagProduct(Tag::kBatch, i) * f) == 0) {
        return std::make_pair(f, i);
      }
    }
  }
  return std::nullopt;
}

// Moves each axis that tiles a core dim onto a batch dim whose size it (or
// a factor of it) divides; what does not fit is replicated.
void Rebatch(DeviceAxes& axes, const Shape& shape, int batch_rank, const Shape& batch_shape,
             bool rebatch, bool split_axes) {
  // Batch axes on broadcast dims of this array only tile padding.
  for (int pos; (pos = FindAxis(axes, [&](const Axis& a) {
                   return a.tag == Tag::kBatch &&
                          !HasBatchDim(shape, batch_rank, batch_shape, a.index);
                 })) >= 0;) {
    axes.Retag(pos, Tag::kReplicated, 0);
  }
  for (int pos; (pos = FindAxis(axes, [](const Axis& a) { return a.tag == Tag::kCore; })) >= 0;) {
    const int64_t size = axes.axes()[pos].size;
    const auto placement = rebatch && size > 1
                               ? Placement(axes, size, shape, batch_rank, batch_shape, split_axes)
                               : std::nullopt;
    if (!placement) {
      axes.Retag(pos, Tag::kReplicated, 0);
      continue;
    }
    const auto [factor, dim] = *placement;
    // The rest of a split axis stays a core axis for the next round.
    if (factor < size) axes.Split(pos, factor);
    axes.Retag(pos, Tag::kBatch, dim);
  }
}

// Tags the axes that tile a reduced core dim of this array as that
// reduction's, where the dim splits evenly (padding would be summed in) into
// parts of at least `min_parts[r]`; returns the reductions left out.
std::vector<int> KeepReducedAxes(DeviceAxes& axes, const Shape& shape, int batch_rank,
                                 const std::vector<int>& reduced,
                                 const std::vector<int64_t>& min_parts) {
  std::vector<int> uneven;
  if (reduced.empty()) return uneven;
  for (int j = 0; j + batch_rank < static_cast<int>(shape.size()); ++j) {
    const int r = reduced[batch_rank + j];
    const int64_t tiles = axes.TagProduct(Tag::kCore, j);
    if (r < 0 || tiles == 1) continue;
    const int64_t min_part = r < static_cast<int>(min_parts.size()) ? min_parts[r] : 1;
    if (shape[batch_rank + j] % tiles != 0 || shape[batch_rank + j] / tiles < min_part) {
      uneven.push_back(r);
      continue;
    }
    for (int pos; (pos = FindAxis(axes, [&](const Axis& a) {
                     return a.tag == Tag::kCore && a.index == j;
                   })) >= 0;) {
      axes.Retag(pos, Tag::kReduced, r);
    }
  }
  return uneven;
}

std::optional<Candidate> CandidateFrom(const Sharding& sharding, const Shape& shape, int batch_rank,
                                       const Shape& batch_shape, const std::vector<int>& reduced,
                                       const std::vector<int64_t>& min_parts, bool rebatch,
                                       bool split_axes) {
  if (sharding.kind != Sharding::Kind::kTiled) return std::nullopt;
  const int offset = static_cast<int>(batch_shape.size()) - batch_rank;
  Candidate candidate{DeviceAxes::FromSharding(sharding, batch_rank, offset)};
  candidate.uneven_reductions =
      KeepReducedAxes(candidate.axes, shape, batch_rank, reduced, min_parts);
  Rebatch(candidate.axes, shape, batch_rank, batch_shape, rebatch, split_axes);
  for (const Axis& axis : candidate.axes.axes()) {
    if (axis.tag == Tag::kBatch) candidate.batch_tiles *= axis.size;
    if (axis.tag == Tag::kReduced) candidate.reduce_tiles *= axis.size;
  }
  return candidate;
}

// Devices that share the work of one batch element.
int64_t Parallelism(const Candidate& candidate) {
  return candidate.batch_tiles * candidate.reduce_tiles;
}

// The plan's sharding for one array, read off the chosen batch sharding.
// An array without reduced dims (a combined result) is replicated over the
// reduction's axes: the combine leaves every device of a group the whole
// result.
Sharding ShardingFor(const DeviceAxes& plan, const Shape& shape, int batch_rank,
                     const Shape& batch_shape, const std::vector<int>& reduced) {
  const int offset = static_cast<int>(batch_shape.size()) - batch_rank;
  return plan.ToSharding(static_cast<int>(shape.size()), [&](const Axis& axis) {
    switch (axis.tag) {
      case Tag::kBatch:
        return HasBatchDim(shape, batch_rank, batch_shape, axis.index) ? axis.index - offset
                                                                       : DeviceAxes::kToReplicated;
      case Tag::kReduced: {
        const auto it = std::find(reduced.begin(), reduced.end(), axis.index);
        return it == reduced.end() ? DeviceAxes::kToReplicated
                                   : static_cast<int>(it - reduced.begin());
      }
      case Tag::kManual:
        return DeviceAxes::kToManual;
      default:
        return DeviceAxes::kToReplicated;
    }
  });
}

Shape LocalShape(const Shape& shape, const Sharding& sharding) {
  if (sharding.kind != Sharding::Kind::kTiled) return shape;
  Shape local = shape;
  for (size_t d = 0; d < shape.size(); ++d) {
    const int64_t t = sharding.tile_dims[d];
    local[d] = (shape[d] + t - 1) / t;
  }
  return local;
}

bool IsManual(const Sharding& sharding) { return sharding.kind == Sharding::Kind::kManual; }

Plan PassThrough(const Problem& problem, const Shape& batch_shape) {
  Plan plan;
  plan.passthrough = true;
  plan.batch_shape = batch_shape;
  plan.batch_tiles.assign(batch_shape.size(), 1);
  plan.operand_shardings = problem.operand_shardings;
  plan.operand_local_shapes = problem.operand_shapes;
  plan.result_local_shapes = problem.result_shapes;
  Sharding manual;
  manual.kind = Sharding::Kind::kManual;
  plan.result_shardings.assign(problem.result_shapes.size(), manual);
  return plan;
}

}  // namespace

int64_t Sharding::NumTiles() const {
  int64_t n = 1;
  for (int64_t t : tile_dims) n *= t;
  for (int64_t t : subgroup_dims) n *= t;
  return n;
}

std::string Sharding::ToString() const {
  std::ostringstream out;
  switch (kind) {
    case Kind::kReplicated:
      return "{replicated}";
    case Kind::kManual:
      return "{manual}";
    case Kind::kMaximal:
      return "{maximal device=" + std::to_string(devices.empty() ? -1 : devices[0]) + "}";
    case Kind::kTiled:
      break;
  }
  out << "{devices=[";
  for (size_t i = 0; i < tile_dims.size(); ++i) out << (i ? "," : "") << tile_dims[i];
  for (int64_t s : subgroup_dims) out << "," << s;
  out << "]";
  for (size_t i = 0; i < devices.size(); ++i) out << (i ? "," : "") << devices[i];
  for (Subgroup kind : subgroup_kinds) {
    out << (kind == Subgroup::kManual ? " manual" : " replicated");
  }
  out << "}";
  return out.str();
}

Shape BroadcastBatchShape(const std::vector<Shape>& shapes, const std::vector<int>& batch_ranks) {
  if (batch_ranks.size() != shapes.size()) {
    throw std::invalid_argument("one batch rank per operand is required");
  }
  for (size_t k = 0; k < shapes.size(); ++k) {
    if (batch_ranks[k] < 0 || batch_ranks[k] > static_cast<int>(shapes[k].size())) {
      Invalid("operand", k,
              "batch rank " + std::to_string(batch_ranks[k]) + " does not fit shape " +
                  DimsToString(shapes[k]));
    }
  }
  int rank = 0;
  for (int r : batch_ranks) rank = std::max(rank, r);
  Shape out(rank, 1);
  for (size_t k = 0; k < shapes.size(); ++k) {
    const int offset = rank - batch_ranks[k];
    for (int m = 0; m < batch_ranks[k]; ++m) {
      const int64_t size = shapes[k][m];
      int64_t& target = out[offset + m];
      if (size == target || size == 1) continue;
      if (target == 1) {
        target = size;
        continue;
      }
      std::vector<int64_t> batch(shapes[k].begin(), shapes[k].begin() + batch_ranks[k]);
      Invalid("operand", k,
              "batch shape " + DimsToString(batch) +
                  " does not broadcast with the other operands' (size " + std::to_string(size) +
                  " against " + std::to_string(target) + ")");
    }
  }
  return out;
}

Plan MakePlan(const Problem& problem) {
  ValidateArrays(problem.operand_shapes, problem.operand_batch_ranks, problem.operand_shardings,
                 false, "operand");
  ValidateArrays(problem.result_shapes, problem.result_batch_ranks, problem.result_shardings, true,
                 "result");
  ValidateReducedDims(problem);
  const Shape batch_shape =
      BroadcastBatchShape(problem.operand_shapes, problem.operand_batch_ranks);
  const int rank_b = static_cast<int>(batch_shape.size());
  for (size_t r = 0; r < problem.result_shapes.size(); ++r) {
    const int b = problem.result_batch_ranks[r];
    if (b > rank_b || !std::equal(problem.result_shapes[r].begin(),
                                  problem.result_shapes[r].begin() + b, batch_shape.end() - b)) {
      Invalid("result", r,
              "shape " + DimsToString(problem.result_shapes[r]) +
                  " does not start with the batch shape " + DimsToString(batch_shape));
    }
  }

  if (std::any_of(problem.operand_shardings.begin(), problem.operand_shardings.end(), IsManual) ||
      std::any_of(problem.result_shardings.begin(), problem.result_shardings.end(), IsManual)) {
    return PassThrough(problem, batch_shape);
  }

  // Operands first, so that a tie keeps the operands where they are.
  std::optional<Candidate> best;
  int64_t num_devices = -1;
  auto consider = [&](const Sharding& sharding, const Shape& shape, int batch_rank,
                      const std::vector<int>& reduced) {
    if (sharding.kind == Sharding::Kind::kTiled) {
      if (num_devices >= 0 && num_devices != sharding.NumTiles()) {
        throw std::invalid_argument(
            "shardings span different numbers of devices: " + std::to_string(num_devices) +
            " and " + std::to_string(sharding.NumTiles()));
      }
      num_devices = sharding.NumTiles();
    }
    auto candidate = CandidateFrom(sharding, shape, batch_rank, batch_shape, reduced,
                                   problem.reduced_min_parts, problem.rebatch,
                                   problem.split_axes);
    if (candidate && (!best || Parallelism(*candidate) > Parallelism(*best))) {
      best = std::move(candidate);
    }
  };
  for (size_t k = 0; k < problem.operand_shapes.size(); ++k) {
    consider(problem.operand_shardings[k], problem.operand_shapes[k],
             problem.operand_batch_ranks[k], ReducedDims(problem.operand_reduced_dims, k));
  }
  for (size_t r = 0; r < problem.result_shardings.size(); ++r) {
    consider(problem.result_shardings[r], problem.result_shapes[r], problem.result_batch_ranks[r],
             ReducedDims(problem.result_reduced_dims, r));
  }

  Plan plan;
  plan.batch_shape = batch_shape;
  plan.batch_tiles.assign(rank_b, 1);
  if (!best) {
    // Nothing is tiled: every device runs the whole batch (XLA's default).
    plan.operand_shardings.assign(problem.operand_shapes.size(), Sharding::Replicated());
    plan.result_shardings.assign(problem.result_shapes.size(), Sharding::Replicated());
    plan.operand_local_shapes = problem.operand_shapes;
    plan.result_local_shapes = problem.result_shapes;
    plan.replication = std::max<int64_t>(num_devices, 1);
    return plan;
  }
  for (int i = 0; i < rank_b; ++i) {
    plan.batch_tiles[i] = best->axes.TagProduct(Tag::kBatch, i);
  }
  plan.replication = best->axes.TagProduct(Tag::kReplicated, 0);
  plan.reduce_tiles = best->reduce_tiles;
  plan.uneven_reductions = best->uneven_reductions;
  plan.reduce_groups =
      best->axes.Groups([](const Axis& axis) { return axis.tag == Tag::kReduced; });
  auto shard = [&](const Shape& shape, int batch_rank, const std::vector<int>& reduced,
                   std::vector<Sharding>& shardings, std::vector<Shape>& local_shapes) {
    shardings.push_back(ShardingFor(best->axes, shape, batch_rank, batch_shape, reduced));
    local_shapes.push_back(LocalShape(shape, shardings.back()));
  };
  for (size_t k = 0; k < problem.operand_shapes.size(); ++k) {
    shard(problem.operand_shapes[k], problem.operand_batch_ranks[k],
          ReducedDims(problem.operand_reduced_dims, k), plan.operand_shardings,
          plan.operand_local_shapes);
  }
  for (size_t r = 0; r < problem.result_shapes.size(); ++r) {
    shard(problem.result_shapes[r], problem.result_batch_ranks[r],
          ReducedDims(problem.result_reduced_dims, r), plan.result_shardings,
          plan.result_local_shapes);
  }
  return plan;
}

}  // namespace batchpart::partition
