"""One call's plan: the C++ planner on a description and XLA's shardings.

The planner knows leading batch dims only. A call whose batch dims follow
some core dims (a signature's ``...`` not in front) is planned on a relabeled
view: each array's dims permuted so that its batch dims lead (shapes and tile
dims alike), and the plan's shardings and local shapes permuted back. Which
dim a tile sits on is a label; devices, tile counts and the decisions stay
the planner's.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from batchpart import _core
from batchpart._partition import shardings as sh
from batchpart._vocab.description import CallDescription
from batchpart._vocab.dims.batch import batch_first, inverse
from batchpart._vocab.dims.combined import min_part
from batchpart._vocab.dims.reduced import combining_op, kept_results, reduced_dims_table

_Kind = _core.Sharding.Kind


@dataclasses.dataclass(frozen=True)
class RelabeledPlan:
  """A ``_core.Plan`` with each array's dims in the call's own order."""
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


def make_plan(d: CallDescription, operand_shapes, operand_shardings, result_shapes,
              result_shardings=None, *, split_axes: bool = True):
  """Plans one call. Shapes are lists of dims; shardings are HloShardings
  (None: replicated operand, or no proposal for a result). Returns a
  ``_core.Plan`` (or, for batch dims that do not lead, a ``RelabeledPlan``
  with the same fields)."""
  operand_perms = [batch_first(len(s), lead, b) for s, lead, b in
                   zip(operand_shapes, d.operand_leads, d.operand_batch_ranks)]
  result_perms = [batch_first(len(s), lead, b) for s, lead, b in
                  zip(result_shapes, d.result_leads, d.result_batch_ranks)]
  problem = _core.Problem()
  problem.operand_shapes = [_take(s, p) for s, p in zip(operand_shapes, operand_perms)]
  problem.operand_batch_ranks = list(d.operand_batch_ranks)
  problem.operand_shardings = [
      permute(sh.to_planner(h, len(s)), p)
      for h, s, p in zip(operand_shardings, operand_shapes, operand_perms)]
  problem.result_shapes = [_take(s, p) for s, p in zip(result_shapes, result_perms)]
  problem.result_batch_ranks = list(d.result_batch_ranks)
  if result_shardings is not None:
    problem.result_shardings = [
        permute(sh.to_planner(h, len(s)), p)
        for h, s, p in zip(result_shardings, result_shapes, result_perms)]
  problem.split_axes = split_axes
  table = reduced_dims_table(d.reductions, [len(s) for s in operand_shapes])
  problem.operand_reduced_dims = [_take(row, p) for row, p in zip(table, operand_perms)]
  if d.reductions:
    kept = kept_results(d.reductions)
    problem.reduced_min_parts = [min_part(combining_op(d.reductions), [
        s for i, s in enumerate(result_shapes) if i not in kept])] * len(d.reductions)
    table = reduced_dims_table(d.reductions, [len(s) for s in result_shapes], results=True)
    problem.result_reduced_dims = [_take(row, p) for row, p in zip(table, result_perms)]
  plan = _core.make_plan(problem)
  if not (d.operand_lead_ranks or d.result_lead_ranks):
    return plan
  back = lambda perms: [inverse(p) for p in perms]
  return RelabeledPlan(
      operand_shardings=[permute(s, p) for s, p in
                         zip(plan.operand_shardings, back(operand_perms))],
      result_shardings=[permute(s, p) for s, p in
                        zip(plan.result_shardings, back(result_perms))],
      operand_local_shapes=[_take(s, p) for s, p in
                            zip(plan.operand_local_shapes, back(operand_perms))],
      result_local_shapes=[_take(s, p) for s, p in
                           zip(plan.result_local_shapes, back(result_perms))],
      batch_shape=list(plan.batch_shape), batch_tiles=list(plan.batch_tiles),
      replication=plan.replication, passthrough=plan.passthrough,
      reduce_groups=[list(g) for g in plan.reduce_groups], reduce_tiles=plan.reduce_tiles,
      uneven_reductions=list(plan.uneven_reductions))


def _take(shape, perm: list[int]) -> list[int]:
  return [int(shape[p]) for p in perm]


def permute(sharding: _core.Sharding, perm: list[int]) -> _core.Sharding:
  """``sharding`` of an array whose dim k becomes dim ``perm.index(k)``: new
  dim i carries old dim ``perm[i]``'s tiles, with the device order
  transposed to match (subgroup dims stay last)."""
  if sharding.kind != _Kind.TILED or perm == sorted(perm):
    return sharding
  tiles, groups = list(sharding.tile_dims), list(sharding.subgroup_dims)
  devices = np.asarray(sharding.devices, dtype=np.int64).reshape(tiles + groups)
  devices = devices.transpose(perm + list(range(len(tiles), len(tiles) + len(groups))))
  out = _core.Sharding()
  out.kind = sharding.kind
  out.tile_dims = [tiles[p] for p in perm]
  out.subgroup_dims = groups
  out.subgroup_kinds = list(sharding.subgroup_kinds)
  out.devices = [int(v) for v in devices.reshape(-1)]
  return out
