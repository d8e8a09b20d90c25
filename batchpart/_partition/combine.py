"""Combining each device's results over the parts of its reduced dims.

``sum``, ``max`` and ``min`` all-reduce each result on its own. A named
combiner (``_vocab/dims/named_combiners``) reads its results together: argmax,
argmin and logsumexp in elementwise ops around all-reduces of result-sized
arrays, max_k and min_k by one all-gather of k candidates and a sort, a
``bp.Combiner`` by one all-gather and the user's merge (``merge``). Results
that keep a reduced dim pass through; no operand ever moves.
"""

from __future__ import annotations

import math

import numpy as np

from batchpart import _compat as compat, _core
from batchpart._partition import emit, merge, shardings as sh
from batchpart._vocab.description import CallDescription
from batchpart._vocab.dims.core import absolute_dim
from batchpart._vocab.dims.named_combiners import (
  ARG_COMBINERS,
  INDEX_COMBINERS,
  TOP_K_COMBINERS,
  lse_dims,
)
from batchpart._vocab.dims.reduced import combining_op, kept_results
from batchpart._vocab.dims.user_combiner import is_user_combiner, registered

ir, hlo = compat.ir, compat.hlo
_Kind = _core.Sharding.Kind


def combine(d: CallDescription, results, groups, part_offsets=None) -> list:
  """``results`` (this device's) combined over each device group in
  ``groups`` by the op of the description's reductions;
  ``part_offsets[partition]`` is the global start of that partition's part
  (the combiners with an index). Results that keep a reduced dim are each
  device's own part: they pass through. Every dim is read by its declared
  core position in the description, never by its place in the array."""
  reductions = d.reductions
  kept = kept_results(reductions)
  combining = [i for i in range(len(results)) if i not in kept]
  layouts = [(d.result_leads[i], d.result_ranks[i] - d.result_leads[i]
              - d.result_batch_ranks[i]) for i in combining]
  out = _combine(d.target, reductions, [results[i] for i in combining], layouts, groups,
                 part_offsets)
  merged = dict(zip(combining, out))
  return [merged.get(i, r) for i, r in enumerate(results)]


def _combine(target: str, reductions, results, layouts, groups, part_offsets) -> list:
  """The combining ``results`` (each with its ``(lead, core)`` ranks)
  merged by the reductions' op."""
  op = combining_op(reductions)
  if not results:
    return []
  if is_user_combiner(op):
    assert part_offsets is not None, "a Combiner merges its parts in order"
    reg = registered(str(op), target)
    results = [_global(r, part_offsets) if i in reg.combiner.index_results else r
               for i, r in enumerate(results)]
    return merge.fold(reg, results, layouts, groups, merge.part_order(groups, part_offsets))
  if op in ARG_COMBINERS:
    assert part_offsets is not None, "an index combines with the parts' offsets"
    return _arg_extreme(op, list(results), groups, part_offsets)
  if op in TOP_K_COMBINERS:
    assert part_offsets is not None, "an index combines with the parts' offsets"
    (axis,) = {a for _, a in reductions[0].k_dims}   # checked: one axis for both
    rank = len(ir.RankedTensorType(results[0].type).shape)
    return _top_k(op, list(results), groups, part_offsets, absolute_dim(axis, rank))
  if op == "logsumexp":
    return _logsumexp(list(results), layouts, groups)
  assert op is not None, "reduce groups come only with reductions"
  return [emit.all_reduce(r, str(op), groups) for r in results]


def part_offsets(reductions, operand_shardings, operand_local_shapes) -> np.ndarray | None:
  """For a combiner with an index, or a Combiner (which merges the parts in
  order): per reduced dim, each partition's global start of its part of
  that dim (an int64 table of shape (dims, partitions)), read off the
  planner sharding of the first operand that has the dim; None otherwise.
  The plan splits a reduced dim only evenly, so a part starts at its tile
  coordinate times the local size."""
  op = combining_op(reductions)
  if op not in INDEX_COMBINERS and not is_user_combiner(op):
    return None
  rows = [_dim_offsets(r, operand_shardings, operand_local_shapes) for r in reductions]
  # A dim that is not split starts at 0 on every partition, however many.
  table = np.zeros((len(rows), max(map(len, rows))), np.int64)
  for row, offsets in zip(table, rows):
    row[:len(offsets)] = offsets
  return table


def _dim_offsets(reduction, operand_shardings, operand_local_shapes) -> np.ndarray:
  """Each partition's global start of its part of one reduced dim."""
  k, axis = reduction.dims[0]
  sharding, local = operand_shardings[k], operand_local_shapes[k]
  dim = absolute_dim(axis, len(local))
  if sharding.kind != _Kind.TILED:
    return np.zeros(max(1, len(sharding.devices)), np.int64)
  devices = sh.device_grid(sharding)
  offsets = np.zeros(max(devices.size, int(devices.max()) + 1), np.int64)
  for coord, device in np.ndenumerate(devices):
    offsets[device] = coord[dim] * int(local[dim])
  return offsets


def _arg_extreme(op: str, results, groups, part_offsets) -> list:
  """NumPy's argmax (argmin) over the parts of ``(value, index)``: the
  extreme value, then the lowest global index holding it; where any part
  holds a NaN, the lowest global index of a NaN, and NaN as the value."""
  value, index = results
  extreme = "max" if op == "argmax" else "min"
  best = emit.all_reduce(value, extreme, groups)
  hit = emit.compare(value, best, "EQ")
  if isinstance(_element(value), ir.FloatType):
    is_nan = emit.compare(value, value, "NE")
    flag = hlo.convert(_like(value, ir.IntegerType.get_signless(32)), is_nan)
    any_nan = emit.compare(emit.all_reduce(flag, "max", groups), emit.splat(0, flag.type), "NE")
    hit = hlo.select(any_nan, is_nan, hit)
    best = hlo.select(any_nan, emit.splat(math.nan, value.type), best)
  never = emit.splat(_integer_max(_element(index)), index.type)
  candidate = hlo.select(hit, _global(index, part_offsets), never)
  return [best, emit.all_reduce(candidate, "min", groups)]


def _global(index, part_offsets):
  """A part-local ``index`` plus this device's part offset (along the one
  reduced dim an index counts along)."""
  (along,) = part_offsets
  offset = _broadcast(hlo.convert(ir.RankedTensorType.get([], _element(index)),
                                  emit.partition_scalar(along)),
                      index.type)
  return hlo.add(index, offset)


def _top_k(op: str, results, groups, part_offsets, k_dim: int) -> list:
  """The k best of every part's k candidates (along dim ``k_dim``): each
  part's indices made global, one all-gather of values and indices, then a
  sort by (NaN first, value, global index) along the gathered candidates,
  keeping the first k. The index breaks every tie, so the order is the
  stable sort of the whole dim whatever the order the devices are gathered
  in."""
  values, index = results
  shape = list(ir.RankedTensorType(values.type).shape)
  parts = len(groups[0])
  # Gathered along a new leading dim, then moved just before k and merged
  # with it: shape with k -> parts * k. (A variadic all-gather along the
  # minor dim mixed rows on XLA's CPU runtime.)
  order = [*range(1, k_dim + 1), 0, *range(k_dim + 1, len(shape) + 1)]
  wide = [*shape[:k_dim], parts * shape[k_dim], *shape[k_dim + 1:]]
  cands = []
  for c in emit.all_gather([emit.reshaped(v, [1, *shape]) for v in
                            (values, _global(index, part_offsets))], 0, groups):
    moved = hlo.transpose(c, ir.DenseI64ArrayAttr.get(order))
    cands.append(emit.reshaped(moved, wide))
  sort = hlo.SortOp([c.type for c in cands], cands, dimension=k_dim, is_stable=False)
  scalars = [ir.RankedTensorType.get([], _element(c)) for c in cands]
  block = sort.regions[0].blocks.append(scalars[0], scalars[0], scalars[1], scalars[1])
  with ir.InsertionPoint(block):
    a, b, ia, ib = block.arguments
    hlo.return_([_ranks_before(a, b, ia, ib, op == "max_k")])
  start, stride = [0] * len(shape), [1] * len(shape)
  return [hlo.slice(r, start, shape, stride) for r in sort.results]


def _ranks_before(a, b, ia, ib, descending: bool):
  """Whether candidate (a, ia) comes before (b, ib): a NaN before any
  number, then the better value, then the lower index."""
  by_index = emit.compare(ia, ib, "LT")
  by_value = emit.compare(a, b, "GT" if descending else "LT")
  if not isinstance(ir.RankedTensorType(a.type).element_type, ir.FloatType):
    return hlo.select(emit.compare(a, b, "EQ"), by_index, by_value)
  nan_a, nan_b = emit.compare(a, a, "NE"), emit.compare(b, b, "NE")
  tie = hlo.or_(emit.compare(a, b, "EQ"), hlo.and_(nan_a, nan_b))
  return hlo.select(emit.compare(nan_a, nan_b, "NE"), nan_a, hlo.select(tie, by_index, by_value))


def _logsumexp(results, layouts, groups) -> list:
  """The parts' log-normalisers merged by logsumexp and each average
  re-weighted by exp(lse_p - lse); parts with lse = -inf add nothing, and
  where every part has it the averages are 0. ``layouts``: each result's
  ``(lead, core)`` ranks, which say where the lse's dims lie in an
  average's (``named_combiners.lse_dims``)."""
  *averages, lse = results
  top = emit.all_reduce(lse, "max", groups)
  # Every part masked: -inf - -inf would be NaN; shift by 0 instead.
  shift = hlo.select(hlo.is_finite(top), top, emit.splat(0.0, top.type))
  weight = hlo.exponential(hlo.subtract(lse, shift))
  total = emit.all_reduce(weight, "sum", groups)
  out = [_reweighted(m, weight, total, groups, lse_dims((_rank(m), *layout), layouts[-1]))
         for m, layout in zip(averages, layouts)]
  return [*out, hlo.add(shift, hlo.log(total))]


def _reweighted(average, weight, total, groups, dims):
  """sum_p weight_p * average_p / total, each weight broadcast into the
  average's ``dims``; a part of weight 0 adds 0 even where its own average
  is NaN (a kernel's 0/0 on a fully masked part)."""
  kind = _element(average)
  w = _broadcast(hlo.convert(_like(weight, kind), weight), average.type, dims)
  empty = _broadcast(emit.compare(weight, emit.splat(0.0, weight.type), "EQ"),
                     _like(average, ir.IntegerType.get_signless(1)), dims)
  zero = emit.splat(0.0, average.type)
  summed = emit.all_reduce(hlo.select(empty, zero, hlo.multiply(w, average)), "sum", groups)
  z = _broadcast(hlo.convert(_like(total, kind), total), average.type, dims)
  none = _broadcast(emit.compare(total, emit.splat(0.0, total.type), "EQ"),
                    _like(average, ir.IntegerType.get_signless(1)), dims)
  return hlo.select(none, zero, hlo.divide(summed, z))


def _rank(value) -> int:
  return len(ir.RankedTensorType(value.type).shape)


def _element(value) -> ir.Type:
  return ir.RankedTensorType(value.type).element_type


def _like(value, element: ir.Type) -> ir.RankedTensorType:
  """``value``'s shape with another element type."""
  return ir.RankedTensorType.get(list(ir.RankedTensorType(value.type).shape), element)


def _broadcast(value, to: ir.Type, dims=None):
  """``value`` broadcast to ``to``, its dims at ``to``'s ``dims`` (default:
  its leading ones)."""
  dims = list(range(_rank(value))) if dims is None else list(dims)
  return hlo.broadcast_in_dim(to, value, ir.DenseI64ArrayAttr.get(dims))


def _integer_max(kind: ir.Type) -> int:
  integer = ir.IntegerType(kind)
  return (1 << integer.width) - 1 if integer.is_unsigned else (1 << (integer.width - 1)) - 1
