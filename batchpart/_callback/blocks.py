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
  block's offsets in the global batch, then the local (padded) batch shape.
  The per-device module replaces it by the row of a constant table for its
  ``partition_id``, so the host side knows where its block lies and how
  much of it is padding; an all-padding block is never passed to the user.

A reduced dim (``reduce=``) the plan keeps sharded is one more axis of the
device grid: the devices along it share a batch block, each gets its own part
of that dim, and the groups along it are the all-reduce's.

Everything is a function of the plan and the description, as for FFI calls.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from batchpart import _compat as compat, _core
from batchpart._partition import shardings as sh
from batchpart._vocab.description import CallDescription
from batchpart._vocab.dims.core import absolute_dim

_Kind = _core.Sharding.Kind
_Subgroup = _core.Sharding.Subgroup


@dataclasses.dataclass(frozen=True)
class Blocks:
  """A callback's per-device picture: shardings (HloSharding), local shapes
  and the (partitions, 2 * batch rank) table of block vectors."""
  operand_shardings: list
  result_shardings: list
  operand_local_shapes: list
  result_local_shapes: list
  table: np.ndarray
  reduce_groups: list


def _batch_shape(d: CallDescription, operand_shapes, result_shapes) -> tuple[int, ...]:
  rank = max([*d.operand_batch_ranks, *d.result_batch_ranks], default=0)
  out = [1] * rank
  for shape, b in [*zip(operand_shapes, d.operand_batch_ranks),
                   *zip(result_shapes, d.result_batch_ranks)]:
    for m in range(b):
      if shape[m] != 1:
        out[rank - b + m] = shape[m]
  return tuple(out)


def _grid(plan, d: CallDescription, operand_shapes, result_shapes, batch, partitions):
  """The device grid: an int array with one axis per batch dim, then one
  replicated axis, then the manual axes; and the manual axes' count. With
  reductions, the results' (whose replicated devices include the reduced
  dims' parts)."""
  rank = len(batch)
  operands = ([] if d.reductions else
              list(zip(operand_shapes, plan.operand_shardings, d.operand_batch_ranks)))
  candidates = [(s, sharding, b) for s, sharding, b in
                [*zip(result_shapes, plan.result_shardings, d.result_batch_ranks),
                 *operands]
                if b == rank]
  tiled = [c for c in candidates if c[1].kind == _Kind.TILED]
  if not tiled:
    return np.arange(partitions).reshape((1,) * rank + (partitions,)), 0
  shape, ref, _ = max(tiled, key=lambda c: math.prod(c[1].tile_dims[:rank]))
  dims = list(ref.tile_dims) + list(ref.subgroup_dims)
  devices = np.asarray(ref.devices, dtype=np.int64).reshape(dims)
  # Core dims are whole in a plan: drop their size-1 axes.
  devices = devices.reshape(dims[:rank] + dims[len(shape):])
  kinds = list(ref.subgroup_kinds)
  rep = [rank + i for i, k in enumerate(kinds) if k == _Subgroup.REPLICATED]
  man = [rank + i for i, k in enumerate(kinds) if k != _Subgroup.REPLICATED]
  devices = devices.transpose(list(range(rank)) + rep + man)
  batch_dims = list(devices.shape[:rank])
  rep_size = math.prod(devices.shape[rank:rank + len(rep)])
  man_dims = list(devices.shape[rank + len(rep):])
  return devices.reshape(batch_dims + [rep_size] + man_dims), len(man_dims)


def _reduction_coords(plan, d: CallDescription, operand_shapes
                      ) -> tuple[dict[int, tuple[int, ...]], list[int]]:
  """Each device's part of every reduced dim the plan keeps sharded, and the
  parts per reduced dim (1 where it is whole), read off the first operand
  that has that dim."""
  coords: dict[int, list[int]] = {}
  tiles = []
  for r in d.reductions:
    k, axis = r.dims[0]
    dim = absolute_dim(axis, len(operand_shapes[k]))
    sharding = plan.operand_shardings[k]
    n = sharding.tile_dims[dim] if sharding.kind == _Kind.TILED else 1
    tiles.append(n)
    if n == 1:
      continue
    shape = list(sharding.tile_dims) + list(sharding.subgroup_dims)
    devices = np.asarray(sharding.devices, dtype=np.int64).reshape(shape)
    for index, device in np.ndenumerate(devices):
      coords.setdefault(int(device), [0] * len(d.reductions))[len(tiles) - 1] = index[dim]
  return {k: tuple(v) for k, v in coords.items()}, tiles


def _split_reductions(grid, rank, n_manual, coords, tiles):
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


def _fold(grid, rank, batch):
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


def _sharding(grid, rank, n_manual, shape, batch_rank, batch, reduced=None):
  """The HloSharding of one array (batch dims right-aligned) on ``grid``,
  and its local shape. ``reduced``: the array's dims cut by the grid's
  reduced-dim axes (dim -> grid axis)."""
  reduced = reduced or {}
  tiles, tiled_axes = [], []
  for m in range(batch_rank):
    k = rank - batch_rank + m
    if shape[m] == batch[k] and batch[k] != 1 and grid.shape[k] > 1:
      tiles.append(grid.shape[k])
      tiled_axes.append(k)
    else:
      tiles.append(1)
  for dim in range(batch_rank, len(shape)):
    axis = reduced.get(dim)
    if axis is not None and grid.shape[axis] > 1:
      tiles.append(grid.shape[axis])
      tiled_axes.append(axis)
    else:
      tiles.append(1)
  local = [-(-int(s) // t) for s, t in zip(shape, tiles)]
  manual_axes = list(range(rank + 1, rank + 1 + n_manual))
  replicated_axes = [k for k in range(grid.ndim)
                     if k not in tiled_axes and k not in manual_axes]
  devices = grid.transpose(tiled_axes + replicated_axes + manual_axes)
  rep = math.prod(grid.shape[k] for k in replicated_axes)
  manual_dims = [grid.shape[k] for k in manual_axes]
  if rep > 1 and not manual_dims and math.prod(tiles) == 1:
    return sh.HloSharding.replicate(), local
  types, sub = [], []
  if rep > 1:
    types.append(compat.OpShardingType.REPLICATED)
    sub.append(rep)
  types += [compat.OpShardingType.MANUAL] * len(manual_dims)
  sub += manual_dims
  arr = np.asarray(devices, dtype=np.int64).reshape(list(tiles) + sub)
  return sh.HloSharding.subgroup_with_device_ordering(arr, subgroup_types=types), local


def plan_blocks(d: CallDescription, plan, operand_shapes, result_shapes) -> Blocks:
  """The callback's shardings, local shapes and block table, from the
  planner's ``plan`` (shapes are the global ones, operand 0 the block
  vector)."""
  partitions = int(d.callback_partitions)
  batch = _batch_shape(d, operand_shapes, result_shapes)
  rank = len(batch)
  grid, n_manual = _grid(plan, d, operand_shapes, result_shapes, batch, partitions)
  coords, reduce_tiles = _reduction_coords(plan, d, operand_shapes)
  grid = _split_reductions(grid, rank, n_manual, coords, reduce_tiles)
  grid = _fold(grid, rank, batch)
  first_reduced = rank + 1 + n_manual
  reduced_axes: dict[int, dict[int, int]] = {}   # operand -> {dim: grid axis}
  for i, r in enumerate(d.reductions):
    for k, axis in r.dims:
      reduced_axes.setdefault(k, {})[absolute_dim(axis, len(operand_shapes[k]))] = (
          first_reduced + i)
  tiles = grid.shape[:rank]
  local_batch = [-(-b // t) for b, t in zip(batch, tiles)]
  table = np.zeros((partitions, 2 * rank), np.int64)
  table[:, :rank] = batch          # a device outside the grid: all padding
  table[:, rank:] = local_batch
  for coord in np.ndindex(*grid.shape):
    device = int(grid[coord])
    if not 0 <= device < partitions:
      raise ValueError(f"device {device} outside the {partitions} partitions "
                       f"of '{d.target}'")
    table[device, :rank] = [c * n for c, n in zip(coord[:rank], local_batch)]
  ops = [_sharding(grid, rank, n_manual, s, b, batch, reduced_axes.get(k))
         for k, (s, b) in enumerate(zip(operand_shapes, d.operand_batch_ranks))]
  res = [_sharding(grid, rank, n_manual, s, b, batch)
         for s, b in zip(result_shapes, d.result_batch_ranks)]
  return Blocks([o[0] for o in ops], [r[0] for r in res], [o[1] for o in ops],
                [r[1] for r in res], table, _groups(grid, first_reduced))


def _groups(grid, first_reduced: int) -> list:
  """The devices along the reduced-dim axes (the grid's last), one group per
  position on the other axes; none without a reduced dim cut in parts."""
  size = math.prod(grid.shape[first_reduced:])
  if size == 1:
    return []
  return np.asarray(grid).reshape(-1, size).tolist()
