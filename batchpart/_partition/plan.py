"""One call's plan: the C++ planner on a description and XLA's shardings.

The planner knows leading batch dims only. A call whose batch dims follow
some core dims (a signature's ``...`` not in front), or that has halo dims,
is planned on a relabeled view: each array's dims permuted so that its batch
dims (halo dims first) lead (shapes and tile dims alike), and the plan's
shardings and local shapes permuted back. Which
dim a tile sits on is a label; devices, tile counts and the decisions stay
the planner's.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from batchpart import _core
from batchpart._partition import shardings as sh
from batchpart._vocab.description import CallDescription
from batchpart._vocab.dims.batch import batch_first, inverse
from batchpart._vocab.dims.core import absolute_dim
from batchpart._vocab.dims.halo import halo_tables, splits_into
from batchpart._vocab.dims.named_combiners import min_part
from batchpart._vocab.dims.reduced import reduced_dims_table
from batchpart._vocab.dims.scan import as_halos

_Kind = _core.Sharding.Kind


@dataclasses.dataclass(frozen=True)
class RelabeledPlan:
  """A ``_core.Plan`` with each array's dims in the call's own order; with
  halo dims, ``halo_tiles`` (the parts of each declared halo dim, 1 where it
  is whole) and ``whole_halos`` (the halo dims the plan keeps whole although
  their sharding would split them: an uneven split or a part shorter than
  ``lo + hi``); with a scanned dim, ``scan_tiles`` (its parts, 1 where it
  is whole)."""
  operand_shardings: list
  result_shardings: list
  operand_local_shapes: list
  result_local_shapes: list
  batch_shape: list
  batch_tiles: list
  replication: int
  passthrough: bool
  reduce_groups: list
  reduce_tiles: int
  uneven_reductions: list
  halo_tiles: tuple = ()
  whole_halos: tuple = ()
  scan_tiles: tuple = ()


def make_plan(d: CallDescription, operand_shapes, operand_shardings, result_shapes,
              result_shardings=None, *, split_axes: bool = True):
  """Plans one call. Shapes are lists of dims; shardings are HloShardings
  (None: replicated operand, or no proposal for a result). Returns a
  ``_core.Plan`` (or, for batch dims that do not lead or halo dims, a
  ``RelabeledPlan`` with the same fields).

  Halo dims are planned as leading batch dims (every result has them, and
  their parts are computed apart), each array given a size-1 dim where it
  lacks one. A halo dim whose split the window cannot take is planned again
  split less finely (into fewer parts of its sharding, the rest of its
  devices replicated) and as a core dim (kept whole, or its axes moved onto
  a batch dim), and the plan with less redundant work is taken. A scanned
  dim is planned as a halo dim of width 0 (its axes stay on it, and the
  state, which lacks it, is replicated over them)."""
  args = (operand_shapes, operand_shardings, result_shapes, result_shardings, split_axes)
  # Fewer parts than a mesh axis has split that axis, which propagation
  # (``split_axes=False``, a jit output's sharding) cannot express.
  plan, view, halos, coarse = _halo_plan(d, args, coarsen=split_axes)
  if coarse:
    whole = _halo_plan(d, args, coarsen=False)
    if whole[0].replication < plan.replication:
      plan, view, halos, coarse = whole
  if not (d.operand_lead_ranks or d.result_lead_ranks or d.halos or d.scans):
    return plan
  tiles = dict(zip(halos, plan.batch_tiles))
  split = [int(t) for t in plan.batch_tiles[len(halos):]]
  whole = tuple(h.name for i, h in enumerate(d.halos) if i not in halos)
  n = len(d.halos)
  operand_views, result_views = view
  return RelabeledPlan(
      operand_shardings=[unview(s, v) for s, v in zip(plan.operand_shardings, operand_views)],
      result_shardings=[unview(s, v) for s, v in zip(plan.result_shardings, result_views)],
      operand_local_shapes=[_unview_shape(s, v) for s, v in
                            zip(plan.operand_local_shapes, operand_views)],
      result_local_shapes=[_unview_shape(s, v) for s, v in
                           zip(plan.result_local_shapes, result_views)],
      batch_shape=list(plan.batch_shape)[len(halos):], batch_tiles=split,
      replication=plan.replication, passthrough=plan.passthrough,
      reduce_groups=[list(g) for g in plan.reduce_groups], reduce_tiles=plan.reduce_tiles,
      uneven_reductions=list(plan.uneven_reductions),
      halo_tiles=tuple(int(tiles.get(i, 1)) for i in range(n)),
      whole_halos=whole,
      scan_tiles=tuple(int(tiles.get(n + i, 1)) for i in range(len(d.scans))))


def _halo_plan(d: CallDescription, args, *, coarsen: bool):
  """The plan whose halo dims are all split so that the windows take them:
  a halo dim split otherwise is cut into fewer parts (``coarsen``), or
  planned as a core dim. Returns the plan, the views, the halos planned as
  halos and the parts of those cut into fewer (scanned dims count as halo
  dims after the declared ones)."""
  planned = (*d.halos, *as_halos(d.scans))
  halos = list(range(len(planned)))
  coarse: dict[int, int] = {}
  while True:
    plan, view = _plan_view(d, [planned[i] for i in halos], *args,
                            coarse={j: coarse[i] for j, i in enumerate(halos) if i in coarse})
    # A scanned dim's parts start where the one before stops: evenly.
    even = lambda i: i >= len(d.halos)
    bad = [(j, i) for j, i in enumerate(halos) if not splits_into(
        planned[i], int(plan.batch_shape[j]), int(plan.batch_tiles[j]), even=even(i))]
    if not bad:
      return plan, view, halos, coarse
    for j, i in bad:
      fewer = _fewer_parts(planned[i], int(plan.batch_shape[j]), int(plan.batch_tiles[j]),
                           even=even(i))
      if coarsen and i not in coarse and fewer:
        coarse[i] = fewer
      else:
        halos.remove(i)
        coarse.pop(i, None)


def _fewer_parts(h, size: int, parts: int, *, even: bool) -> int | None:
  """The most parts, fewer than ``parts`` and dividing it, that a halo dim of
  ``size`` may be cut into; None where no split of more than one part can."""
  return next((f for f in range(parts - 1, 1, -1)
               if parts % f == 0 and splits_into(h, size, f, even=even)), None)


def _coarsened(sharding: _core.Sharding, dim: int, parts: int) -> _core.Sharding:
  """``sharding`` with view dim ``dim`` cut into ``parts`` (a divisor of its
  tiles there): the minor rest of its tiles becomes a replicated subgroup."""
  tiles = list(sharding.tile_dims)
  if sharding.kind != _Kind.TILED or tiles[dim] <= parts or tiles[dim] % parts:
    return sharding
  groups = list(sharding.subgroup_dims)
  rest = tiles[dim] // parts
  devices = sh.device_grid(sharding).reshape(tiles[:dim] + [parts, rest] + tiles[dim + 1:]
                                             + groups)
  return sh.tiled(tiles[:dim] + [parts] + tiles[dim + 1:], groups + [rest],
                  [*sharding.subgroup_kinds, _core.Sharding.Subgroup.REPLICATED],
                  np.moveaxis(devices, dim + 1, -1).reshape(-1))


def _plan_view(d, halos, operand_shapes, operand_shardings, result_shapes,
               result_shardings, split_axes, *, coarse=None):
  """The planner on each array's view (``_views``): the plan and the views;
  ``coarse``: view dim -> the parts to cut it into, fewer than the
  shardings' (``_coarsened``)."""
  def viewed(h, s, v):
    out = view(sh.to_planner(h, len(s)), v)
    for dim, parts in (coarse or {}).items():
      out = _coarsened(out, dim, parts)
    return out

  operand_views, result_views = _views(d, halos, operand_shapes, result_shapes)
  operand_ranks = [len(s) for s in operand_shapes]
  problem = _core.Problem()
  problem.operand_shapes = [_view_shape(s, v) for s, v in zip(operand_shapes, operand_views)]
  problem.operand_batch_ranks = [v.batch_rank for v in operand_views]
  problem.operand_shardings = [
      viewed(h, s, v) for h, s, v in zip(operand_shardings, operand_shapes, operand_views)]
  problem.result_shapes = [_view_shape(s, v) for s, v in zip(result_shapes, result_views)]
  problem.result_batch_ranks = [v.batch_rank for v in result_views]
  if result_shardings is not None:
    problem.result_shardings = [
        viewed(h, s, v) for h, s, v in zip(result_shardings, result_shapes, result_views)]
  problem.split_axes = split_axes
  problem.operand_reduced_dims = _in_views(reduced_dims_table(d.reductions, operand_ranks),
                                           operand_views)
  if d.reductions:
    problem.reduced_min_parts = [min_part(r, result_shapes) for r in d.reductions]
    problem.result_reduced_dims = _in_views(
        reduced_dims_table(d.reductions, [len(s) for s in result_shapes], results=True),
        result_views)
  return _core.make_plan(problem), (operand_views, result_views)


@dataclasses.dataclass(frozen=True)
class _View:
  """How the planner sees one array: ``dims[i]`` is the array dim at view
  dim i, or None for a dim the array lacks (of size 1, or of the size
  ``phantom`` gives: a scanned dim a result without it is planned with, as
  the planner wants every result to have the whole batch); the first
  ``batch_rank`` view dims are batch dims."""
  dims: tuple
  batch_rank: int
  phantom: tuple = ()


def _views(d: CallDescription, halos, operand_shapes, result_shapes):
  """Each array's view: its halo dims (in declaration order), then its batch
  dims, then its other core dims. With halo dims every array gets the full
  batch rank (size-1 dims where it has fewer), so that its halo dims line
  up with everyone's."""
  operand_halo, result_halo = halo_tables(halos, [len(s) for s in operand_shapes],
                                          [len(s) for s in result_shapes])
  full = max((*d.operand_batch_ranks, *d.result_batch_ranks), default=0)
  sizes = [int(operand_shapes[k][absolute_dim(axis, len(operand_shapes[k]))])
           for k, axis in (h.operand_dims[0] for h in halos)]

  def one(rank, lead, b, halo_row, result=False):
    pad = full - b if halos else 0
    order = [e for e in batch_first(rank, lead, b) if e not in halo_row]
    phantom = tuple((i, n) for i, (e, n) in enumerate(zip(halo_row, sizes))
                    if e is None and result)
    return _View((*halo_row, *(None,) * pad, *order[:b], *order[b:]),
                 len(halo_row) + pad + b, phantom)

  return ([one(len(s), lead, b, row) for s, lead, b, row in
           zip(operand_shapes, d.operand_leads, d.operand_batch_ranks, operand_halo)],
          [one(len(s), lead, b, row, True) for s, lead, b, row in
           zip(result_shapes, d.result_leads, d.result_batch_ranks, result_halo)])


def _in_views(table, views) -> list[list[int]]:
  """A per-array, per-dim table of reduced-dim indices in each array's view
  (-1 at an inserted dim); ``[]`` stays ``[]``."""
  return [[-1 if e is None else row[e] for e in v.dims] for row, v in zip(table, views)]


def _view_shape(shape, v: _View) -> list[int]:
  phantom = dict(v.phantom)
  return [phantom.get(i, 1) if e is None else int(shape[e]) for i, e in enumerate(v.dims)]


def _unview_shape(shape, v: _View) -> list[int]:
  out = [0] * sum(e is not None for e in v.dims)
  for size, e in zip(shape, v.dims):
    if e is not None:
      out[e] = int(size)
  return out


def view(sharding: _core.Sharding, v: _View) -> _core.Sharding:
  """An array's planner sharding in its view: dims reordered, a tile count
  of 1 for each inserted dim (the device order does not change)."""
  real = [e for e in v.dims if e is not None]
  out = permute(sharding, real)
  if out.kind != _Kind.TILED or len(real) == len(v.dims):
    return out
  tiles = iter(out.tile_dims)
  out.tile_dims = [1 if e is None else next(tiles) for e in v.dims]
  return out


def unview(sharding: _core.Sharding, v: _View) -> _core.Sharding:
  """``view`` undone: inserted dims dropped, dims put back. An array lacks
  an inserted dim, so it is the same along it: the devices the planner
  tiled it over (a batch dim of size 1 split into padding, or a scanned dim
  a result lacks) replicate."""
  real = [e for e in v.dims if e is not None]
  if sharding.kind == _Kind.TILED and len(real) != len(v.dims):
    sharding = _replicate_inserted(sharding, [e is None for e in v.dims])
  return permute(sharding, inverse(real))


def _replicate_inserted(sharding: _core.Sharding, inserted: list[bool]) -> _core.Sharding:
  """``sharding`` without the dims flagged ``inserted``; their tiles join
  its replicated subgroup (one is added where it has none)."""
  tiles, groups = list(sharding.tile_dims), list(sharding.subgroup_dims)
  kinds = list(sharding.subgroup_kinds)
  devices = sh.device_grid(sharding)
  extra = [i for i, flag in enumerate(inserted) if flag]
  if math.prod(tiles[i] for i in extra) == 1:
    return sh.tiled([t for t, flag in zip(tiles, inserted) if not flag], groups, kinds,
                    sharding.devices)
  kept = [i for i, flag in enumerate(inserted) if not flag]
  rank = len(tiles)
  rep = next((i for i, k in enumerate(kinds) if k == _core.Sharding.Subgroup.REPLICATED),
             None)
  if rep is None:
    kinds.append(_core.Sharding.Subgroup.REPLICATED)
    groups.append(1)
    devices = devices.reshape(devices.shape + (1,))
    rep = len(groups) - 1
  others = [rank + g for g in range(len(groups)) if g != rep]
  order = [*kept, *others[:rep], rank + rep, *extra, *others[rep:]]
  groups[rep] *= math.prod(tiles[i] for i in extra)
  return sh.tiled([tiles[i] for i in kept], groups, kinds, devices.transpose(order).reshape(-1))


def permute(sharding: _core.Sharding, perm: list[int]) -> _core.Sharding:
  """``sharding`` of an array whose dim k becomes dim ``perm.index(k)``: new
  dim i carries old dim ``perm[i]``'s tiles, with the device order
  transposed to match (subgroup dims stay last)."""
  if sharding.kind != _Kind.TILED or perm == sorted(perm):
    return sharding
  tiles, groups = list(sharding.tile_dims), list(sharding.subgroup_dims)
  devices = sh.device_grid(sharding).transpose(
      perm + list(range(len(tiles), len(tiles) + len(groups))))
  return sh.tiled([tiles[p] for p in perm], groups, sharding.subgroup_kinds,
                  devices.reshape(-1))
