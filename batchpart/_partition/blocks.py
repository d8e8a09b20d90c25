"""A host callback's blocks on its plan (``_vocab/blocks``): the device grid
read off the planner's shardings, and each array's sharding and local shape
on that grid once every device has a block of its own.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from batchpart import _compat as compat, _core
from batchpart._partition import shardings as sh
from batchpart._vocab import blocks
from batchpart._vocab.description import CallDescription
from batchpart._vocab.dims.core import absolute_dim
from batchpart._vocab.dims.scan import as_halos

_Kind = _core.Sharding.Kind
TILED = _Kind.TILED
_Subgroup = _core.Sharding.Subgroup


@dataclasses.dataclass(frozen=True)
class Blocks:
  """A callback's per-device picture: shardings (HloSharding), local shapes,
  the table of block vectors, the reduce groups and the parts of each
  scanned dim (1 where it is whole)."""
  operand_shardings: list
  result_shardings: list
  operand_local_shapes: list
  result_local_shapes: list
  table: np.ndarray
  reduce_groups: list
  scan_tiles: tuple = ()


def windowed(d: CallDescription) -> tuple:
  """The dims a callback's grid cuts into windows: the halo dims, then each
  scanned dim as a halo dim of width 0 (its window is its part)."""
  return (*d.halos, *as_halos(d.scans))


def _grid(plan, d: CallDescription, operand_shapes, result_shapes, batch, partitions):
  """The device grid: an int array with one axis per batch dim, then one
  replicated axis, then the manual axes, then one axis per halo and scanned
  dim; and the manual axes' count. With reductions, the results' (whose
  replicated devices include the reduced dims' parts); with halo dims, a
  result's (which has every one); with a scanned dim, an array's that has
  it."""
  rank = len(batch)
  halos = len(windowed(d))
  operands = ([] if d.reductions or d.halos else
              [(s, sharding, b, window_dims(d, "o", k, len(s))) for k, (s, sharding, b) in
               enumerate(zip(operand_shapes, plan.operand_shardings, d.operand_batch_ranks))])
  results = [(s, sharding, b, window_dims(d, "r", k, len(s))) for k, (s, sharding, b) in
             enumerate(zip(result_shapes, plan.result_shardings, d.result_batch_ranks))]
  candidates = [c for c in [*results, *operands] if c[2] == rank and len(c[3]) == halos]
  tiled = [c for c in candidates if c[1].kind == _Kind.TILED]
  if not tiled:
    return np.arange(partitions).reshape((1,) * rank + (partitions,) + (1,) * halos), 0
  shape, ref, _, halo_dims = max(tiled, key=lambda c: math.prod(c[1].tile_dims[:rank]))
  devices = sh.device_grid(ref)
  dims, n = list(devices.shape), len(shape)
  kinds = list(ref.subgroup_kinds)
  # A core dim the reference splits that is no halo dim is a reduced dim a
  # result keeps: its devices share a batch block as replicated ones do
  # (``split_reductions`` sorts them into parts); the other core dims are
  # whole (size 1).
  rep = [*(k for k in range(rank, n) if k not in halo_dims),
         *(n + i for i, k in enumerate(kinds) if k == _Subgroup.REPLICATED)]
  man = [n + i for i, k in enumerate(kinds) if k != _Subgroup.REPLICATED]
  devices = devices.transpose([*range(rank), *rep, *man, *halo_dims])
  rest = [dims[k] for k in (*man, *halo_dims)]
  return devices.reshape(dims[:rank] + [math.prod(dims[k] for k in rep)] + rest), len(man)


def result_halo_dims(d: CallDescription, k: int, rank: int) -> list[int]:
  """Result ``k``'s dim of each halo dim, in declaration order."""
  return [absolute_dim(dict(h.result_dims)[k], rank) for h in d.halos]


def window_dims(d: CallDescription, which: str, k: int, rank: int) -> list[int]:
  """Operand (``which`` "o") or result ("r") ``k``'s dim of each halo and
  scanned dim (``windowed``) it has, in that order."""
  dims = [dict(h.operand_dims if which == "o" else h.result_dims).get(k)
          for h in windowed(d)]
  return [absolute_dim(a, rank) for a in dims if a is not None]


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
    for index, device in np.ndenumerate(sh.device_grid(sharding)):
      coords.setdefault(int(device), [0] * len(d.reductions))[len(tiles) - 1] = index[dim]
  return {k: tuple(v) for k, v in coords.items()}, tiles


def _sharding(grid, rank, n_manual, shape, batch_rank, batch, reduced=None):
  """The HloSharding of one array (batch dims right-aligned) on ``grid``,
  and its local shape. ``reduced``: the array's dims cut by the grid's
  reduced-dim and halo-dim axes (dim -> grid axis)."""
  reduced = reduced or {}
  tiles, tiled_axes = [], []
  for m in range(batch_rank):
    k = rank - batch_rank + m
    # A batch dim of size 1 the grid tiles (a call with no batch dims, given
    # one, or a batch of one folded over replicated devices) is tiled too:
    # one device holds the element, the others padding, never a copy each.
    if shape[m] == batch[k] and grid.shape[k] > 1:
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
  batch = blocks.batch_shape(d, operand_shapes, result_shapes)
  rank = len(batch)
  grid, n_manual = _grid(plan, d, operand_shapes, result_shapes, batch, partitions)
  coords, reduce_tiles = _reduction_coords(plan, d, operand_shapes)
  grid = blocks.split_reductions(grid, rank, n_manual, coords, reduce_tiles)
  grid = blocks.fold(grid, rank, batch)
  first_halo = rank + 1 + n_manual
  halos = windowed(d)
  first_reduced = first_halo + len(halos)
  split_axes: dict[tuple[str, int], dict[int, int]] = {}   # array -> {dim: grid axis}
  for i, r in enumerate(d.reductions):
    for k, axis in r.dims:
      split_axes.setdefault(("o", k), {})[absolute_dim(axis, len(operand_shapes[k]))] = (
          first_reduced + i)
    for k, axis in r.results:
      split_axes.setdefault(("r", k), {})[absolute_dim(axis, len(result_shapes[k]))] = (
          first_reduced + i)
  for i, h in enumerate(halos):
    for which, dims, shapes in (("o", h.operand_dims, operand_shapes),
                                ("r", h.result_dims, result_shapes)):
      for k, axis in dims:
        split_axes.setdefault((which, k), {})[absolute_dim(axis, len(shapes[k]))] = (
            first_halo + i)
  ops = [_sharding(grid, rank, n_manual, s, b, batch, split_axes.get(("o", k)))
         for k, (s, b) in enumerate(zip(operand_shapes, d.operand_batch_ranks))]
  parts = []
  for i, r in enumerate(d.reductions):
    k, axis = r.dims[0]
    parts.append((first_reduced + i, ops[k][1][absolute_dim(axis, len(operand_shapes[k]))]))
  table = blocks.block_table(
      grid, batch, partitions, d.target, parts, halos,
      [first_halo + i for i in range(len(halos))],
      [operand_shapes[k][absolute_dim(axis, len(operand_shapes[k]))]
       for k, axis in (h.operand_dims[0] for h in halos)])
  res = [_sharding(grid, rank, n_manual, s, b, batch, split_axes.get(("r", k)))
         for k, (s, b) in enumerate(zip(result_shapes, d.result_batch_ranks))]
  return Blocks([o[0] for o in ops], [r[0] for r in res], [o[1] for o in ops],
                [r[1] for r in res], table, blocks.reduce_groups(grid, first_reduced),
                tuple(grid.shape[first_halo + len(d.halos) + i] for i in range(len(d.scans))))
