"""Which block of the batch each partition's host callback gets.

A host callback is partitioned like an FFI call (the planner picks the batch
sharding), with two differences that make its contract hold:

- **Split, never replicate.** Devices the plan leaves replicating a batch
  block (a batch sharded over part of the mesh, or not sharded at all) would
  each call the callback on the same elements: ``io_callback``'s side effect
  would happen twice and ``pure_callback`` would compute everything N
  times. Here every replicated subgroup is folded into the batch dim with the
  most elements per block, so each device gets its own block (padding
  allowed); XLA gathers the results where a consumer needs them replicated.
- **The block vector.** Operand 0 of a callback is an int64 vector: the
  block's offsets in the global batch, then the local (padded) batch shape,
  then, with reduced dims, each one's part start and part size.
  The per-device module replaces it by the row of a constant table for its
  ``partition_id``, so the host side knows where its block lies and how
  much of it is padding; an all-padding block is never passed to the user.

A reduced dim (``reduce=``) the plan keeps sharded is one more axis of the
device grid: the devices along it share a batch block, each gets its own part
of that dim, and the groups along it are the all-reduce's. A halo dim
(``halo=``) the plan splits is one too, before the reduced dims' axes; the
block vector then ends with four entries per halo dim: where the device's
window lies and where its kept part lies, in global positions
(``dims/halo.part_extent``). A scanned dim (``scan=``) the plan splits is
carried as a halo dim of width 0 after the halo dims: its window and kept
part are the device's part of the sequence.

The device grid is an int array of device ids with one axis per batch dim,
one replicated axis and the manual axes (then one axis per reduced dim); the
partitioner reads it off the plan (``_partition/blocks``). Everything here is
a function of that grid and the description, as for FFI calls.
"""

from __future__ import annotations

import math

import numpy as np

from batchpart._vocab.description import CallDescription
from batchpart._vocab.dims.halo import part_extent, whole_extents


def whole_block(batch, reduced=(), halos=(), halo_sizes=()) -> np.ndarray:
  """The block vector of the whole batch: offsets zero, no padding, each
  reduced dim (of sizes ``reduced``) and each halo dim whole (where XLA does
  not partition the call)."""
  return np.asarray([0] * len(batch) + list(batch) + [0] * len(reduced) + list(reduced)
                    + whole_extents(halos, halo_sizes),
                    np.int64)


def block_extent(batch, block) -> tuple[list[int], list[int], list[int]]:
  """What a block vector says, per batch dim: the block's offset in the
  global batch, its local (padded) size, and how much of it is batch (the
  rest is padding; 0: all padding)."""
  rank = len(batch)
  values = [int(v) for v in np.asarray(block).reshape(-1)]
  offsets, local = values[:rank], values[rank:2 * rank]
  return offsets, local, [max(0, min(b - o, n)) for b, o, n in zip(batch, offsets, local)]


def reduced_parts(batch, block, reduced: int) -> tuple[slice, ...]:
  """What a block vector says about its ``reduced`` reduced dims: each one's
  part, as a slice of the whole dim."""
  values = [int(v) for v in np.asarray(block).reshape(-1)][2 * len(batch):]
  return tuple(slice(s, s + n) for s, n in zip(values[:reduced], values[reduced:2 * reduced]))


def halo_extents(batch, block, reduced: int, halos: int) -> list[tuple[int, ...]]:
  """What a block vector says about its ``halos`` halo dims (after its
  ``reduced`` reduced dims): each one's (window start, window stop, kept
  start, kept stop)."""
  values = [int(v) for v in np.asarray(block).reshape(-1)][2 * len(batch) + 2 * reduced:]
  return [tuple(values[4 * i:4 * i + 4]) for i in range(halos)]


def batch_shape(d: CallDescription, operand_shapes, result_shapes) -> tuple[int, ...]:
  """The call's batch shape: each batch dim's size where some array spans
  it, 1 where every array broadcasts it."""
  rank = max([*d.operand_batch_ranks, *d.result_batch_ranks], default=0)
  out = [1] * rank
  for shape, b in [*zip(operand_shapes, d.operand_batch_ranks),
                   *zip(result_shapes, d.result_batch_ranks)]:
    for m in range(b):
      if shape[m] != 1:
        out[rank - b + m] = shape[m]
  return tuple(out)


def split_reductions(grid, rank, n_manual, coords, tiles):
  """The grid with the reduced dims' parts taken out of its replicated axis
  into axes of their own, after the manual axes: devices that share a batch
  block and every other coordinate, one per part."""
  if math.prod(tiles) == 1:
    return grid.reshape(grid.shape + (1,) * len(tiles))
  rep = grid.shape[rank] // math.prod(tiles)
  moved = np.moveaxis(grid, rank, -1)   # batch..., manual..., replicated
  out = np.empty(moved.shape[:-1] + (rep, *tiles), dtype=np.int64)
  zero = (0,) * len(tiles)
  for cell in np.ndindex(*moved.shape[:-1]):
    seen: dict[tuple, int] = {}
    for device in moved[cell]:
      part = coords.get(int(device), zero)
      out[cell + (seen.get(part, 0),) + part] = device
      seen[part] = seen.get(part, 0) + 1
    if any(v != rep for v in seen.values()) or len(seen) != math.prod(tiles):
      raise ValueError("the reduced dims' parts do not split the replicated devices evenly")
  # batch..., rep, manual..., reduced...
  n = moved.ndim - 1
  order = list(range(rank)) + [n] + list(range(rank, n)) + list(range(n + 1, n + 1 + len(tiles)))
  return out.transpose(order)


def fold(grid, rank, batch):
  """Folds the replicated axis into the batch dim with the most elements
  per block: every device gets a block of its own."""
  rep = grid.shape[rank]
  if rep == 1:
    return grid
  tiles = grid.shape[:rank]
  j = max(range(rank), key=lambda k: (-(-batch[k] // tiles[k]), -k))
  order = list(range(grid.ndim))
  order.remove(rank)
  order.insert(j + 1, rank)
  folded = grid.transpose(order)
  shape = list(folded.shape)
  shape[j:j + 2] = [shape[j] * shape[j + 1]]
  # One replicated axis of size 1 keeps the layout: batch, replicated, manual.
  shape.insert(rank, 1)
  return folded.reshape(shape)


def block_table(grid, batch, partitions: int, target: str, reduced=(), halos=(),
                halo_axes=(), halo_sizes=()) -> np.ndarray:
  """The table of block vectors on the folded ``grid``, one row per
  partition: each device's block offsets, then the local batch shape, then
  each reduced dim's part start and size (``reduced``: each one's grid axis
  and part size), then each halo dim's window and kept part (its parts along
  grid axis ``halo_axes[i]``, of ``halo_sizes[i]`` elements). A device
  outside the grid gets all padding."""
  rank, r = len(batch), len(reduced)
  tiles = grid.shape[:rank]
  local_batch = [-(-b // t) for b, t in zip(batch, tiles)]
  table = np.zeros((partitions, 2 * rank + 2 * r + 4 * len(halos)), np.int64)
  table[:, :rank] = batch          # a device outside the grid: all padding
  table[:, rank:2 * rank] = local_batch
  table[:, 2 * rank + r:2 * rank + 2 * r] = [n for _, n in reduced]
  table[:, 2 * rank + 2 * r:] = whole_extents(halos, halo_sizes)
  for coord in np.ndindex(*grid.shape):
    device = int(grid[coord])
    if not 0 <= device < partitions:
      raise ValueError(f"device {device} outside the {partitions} partitions "
                       f"of '{target}'")
    table[device, :rank] = [c * n for c, n in zip(coord[:rank], local_batch)]
    table[device, 2 * rank:2 * rank + r] = [coord[axis] * n for axis, n in reduced]
    table[device, 2 * rank + 2 * r:] = [
        v for h, axis, n in zip(halos, halo_axes, halo_sizes)
        for v in part_extent(h, int(n), grid.shape[axis], coord[axis])]
  return table


def reduce_groups(grid, first_reduced: int) -> list:
  """The devices along the reduced-dim axes (the grid's last), one group per
  position on the other axes; none without a reduced dim cut in parts."""
  size = math.prod(grid.shape[first_reduced:])
  if size == 1:
    return []
  return np.asarray(grid).reshape(-1, size).tolist()
