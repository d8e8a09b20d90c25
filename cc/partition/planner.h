// The batchpart partition planner.
//
// Pure C++17: it knows nothing of XLA or Python. Given the shapes of a
// batch-partitionable call's operands and results, how many leading dims of
// each are batch dims, and the shardings XLA proposes, it decides how every
// operand and result must be sharded so that each device runs the kernel on
// its own slice of the batch (docs/partitioning.md, "What the planner decides").
#ifndef BATCHPART_PARTITION_PLANNER_H_
#define BATCHPART_PARTITION_PLANNER_H_

#include <cstdint>
#include <string>
#include <vector>

namespace batchpart::partition {

using Shape = std::vector<int64_t>;

// A plain mirror of XLA's HloSharding for one array (never a tuple).
struct Sharding {
  enum class Kind { kReplicated, kTiled, kManual, kMaximal };
  enum class Subgroup { kReplicated, kManual };

  Kind kind = Kind::kReplicated;
  // kTiled: one tile count per array dim, then trailing subgroup dims.
  std::vector<int64_t> tile_dims;
  std::vector<int64_t> subgroup_dims;
  std::vector<Subgroup> subgroup_kinds;
  // Row-major over tile_dims ++ subgroup_dims (kTiled), or the one device
  // (kMaximal).
  std::vector<int64_t> devices;

  static Sharding Replicated() { return Sharding{}; }
  int64_t NumTiles() const;  // product of tile_dims and subgroup_dims
  std::string ToString() const;
};

struct Problem {
  std::vector<Shape> operand_shapes;
  std::vector<int> operand_batch_ranks;  // leading dims that are batch dims
  std::vector<Sharding> operand_shardings;
  std::vector<Shape> result_shapes;
  std::vector<int> result_batch_ranks;
  // Shardings XLA proposes for the results (Shardy's propagation result);
  // empty when there is none. A hint, never a constraint.
  std::vector<Sharding> result_shardings;
  // Move mesh axes that tile core dims onto batch dims (docs/partitioning.md, step 2).
  bool rebatch = true;
  // Allow moving only a factor of such an axis (the rest replicated). A
  // split axis is fine inside a program but cannot be expressed on jax's
  // mesh, so sharding propagation (which may fix a jit output) turns it off.
  bool split_axes = true;
  // Per operand, per dim: the reduction (an index into the call's declared
  // reductions) that dim is summed over, or -1. Empty, or an empty entry for
  // an operand: no reduced dims. A mesh axis that evenly tiles a reduced dim
  // stays there: each device computes a partial result over its part and
  // the results are combined over `Plan::reduce_groups`.
  std::vector<std::vector<int>> operand_reduced_dims;
  // The same table for the results: a result that keeps a reduced dim is
  // split along it like the operands (each device writes its own part) and
  // is not combined. Empty: no result has one.
  std::vector<std::vector<int>> result_reduced_dims;
  // Per reduction: the smallest part a device may hold (a top-k needs k
  // candidates from each part); a finer split keeps the dim as any core dim.
  // Empty: 1 for each.
  std::vector<int64_t> reduced_min_parts;
};

struct Plan {
  std::vector<Sharding> operand_shardings;
  std::vector<Sharding> result_shardings;
  std::vector<Shape> operand_local_shapes;
  std::vector<Shape> result_local_shapes;
  Shape batch_shape;                 // broadcast batch shape (global)
  std::vector<int64_t> batch_tiles;  // tiles per batch dim of batch_shape
  // Devices that compute each batch element (1 = no redundant work).
  int64_t replication = 1;
  // Manual sharding: shardings and shapes pass through untouched.
  bool passthrough = false;
  // The device groups whose partial results one all-reduce combines (each
  // group: the devices that differ only in the parts of the reduced dims);
  // empty when no reduced dim stays sharded.
  std::vector<std::vector<int64_t>> reduce_groups;
  // Parts each reduced dim's devices split it into (product over reductions).
  int64_t reduce_tiles = 1;
  // Reductions whose dim was sharded unevenly (or into parts smaller than
  // their minimum) in the chosen sharding: padding would enter the result,
  // so that dim is handled as any core dim instead (re-batched or gathered).
  std::vector<int> uneven_reductions;
};

// Broadcast (NumPy rules, right-aligned) of the operands' batch shapes.
// Throws std::invalid_argument naming the operand that does not broadcast.
Shape BroadcastBatchShape(const std::vector<Shape>& shapes, const std::vector<int>& batch_ranks);

// Throws std::invalid_argument on inconsistent input (ranks, shardings that
// do not match their arrays, device lists that are not permutations).
Plan MakePlan(const Problem& problem);

}  // namespace batchpart::partition

#endif  // BATCHPART_PARTITION_PLANNER_H_
