"""Reduced core dims: ``reduce={"n": "sum"}``.

A reduced dim is a core dim of the operands over which every result that
does not have it *combines*: each result equals the reduction (sum, max or min),
over any split of that dim into parts, of the results computed on the parts
(a dot over its contraction dim, a NUFFT type 1 over its points, a
log-likelihood over its data). Where that dim is sharded, each device runs
the call on its own part and one all-reduce combines the results. A named
combiner (``named_combiners``) reads the results together instead. A result that
has the dim keeps it: it is split along it like the operands (each device
writes its own part) and is not combined.

A reduction names its dim by its core axis in each operand that has it
(``core``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import jax
import numpy as np

from batchpart import _compat as compat
from batchpart._vocab.dims.core import absolute_dim, core_shape
from batchpart._vocab.dims.named_combiners import (
  COMBINERS,
  ResultDims,
  check_combiner_dims,
  check_combining_results,
  is_combiner,
)
from batchpart._vocab.dims.user_combiner import Combiner, lowered_name

OPS = ("sum", "max", "min")      # each result combined on its own
ALL_OPS = OPS + COMBINERS


@dataclasses.dataclass(frozen=True)
class Reduction:
  """One reduced dim: its signature name, the op, where each operand that
  has it holds it, as ``(operand, core axis)`` pairs, and where each result
  that keeps it does, as ``(result, core axis)`` pairs. For ``max_k`` and
  ``min_k``, ``k_dims``: where each combining result holds its k candidates,
  as ``(result, core axis)`` pairs."""
  name: str
  op: str | Combiner
  dims: tuple[tuple[int, int], ...]
  results: tuple[tuple[int, int], ...] = ()
  k_dims: tuple[tuple[int, int], ...] = ()


def reduced_dims_table(reductions, operand_ranks, *, results: bool = False
                       ) -> list[list[int]]:
  """Per operand (or, with ``results``, per result), per dim: the index of
  the reduction that dim belongs to, or -1 (the planner's
  ``operand_reduced_dims`` / ``result_reduced_dims``); ``[]`` where none has
  one."""
  places = [(i, r.results if results else r.dims) for i, r in enumerate(reductions)]
  if not any(where for _, where in places):
    return []
  table = [[-1] * int(r) for r in operand_ranks]
  for i, where in places:
    for k, axis in where:
      table[k][absolute_dim(axis, len(table[k]))] = i
  return table


def kept_results(reductions) -> frozenset[int]:
  """The results that keep a reduced dim (split, never combined)."""
  return frozenset(k for r in reductions for k, _ in r.results)


def check_kept_whole(owner: str, reductions) -> None:
  """Refuses a result that keeps some reduced dims but not all: it would
  need combining over the others while split along these, which the merge
  does not do."""
  for k in sorted(kept_results(reductions)):
    lacks = [r.name for r in reductions if k not in {i for i, _ in r.results}]
    if lacks:
      keeps = [r.name for r in reductions if r.name not in lacks]
      raise ValueError(f"{owner}: result {k} keeps the reduced dim(s) {', '.join(keeps)} "
                       f"but not {', '.join(lacks)}; a result keeps every reduced dim or "
                       "none. Declare the dims it lacks in a call of their own.")


def combining_op(reductions) -> str | Combiner | None:
  """The op that combines the results (every reduction has the same one)."""
  return reductions[0].op if reductions else None


def check_reduce_mapping(owner: str, reduce) -> dict[str, str]:
  """``reduce`` as a dict of dim name -> op, checked for shape."""
  if not isinstance(reduce, Mapping) or not all(isinstance(k, str) for k in reduce):
    raise TypeError(f"{owner}: reduce must be a dict of core dim name -> op "
                    f"({', '.join(map(repr, ALL_OPS))}), e.g. reduce={{'n': 'sum'}}; got "
                    f"{reduce!r}.")
  for name, op in reduce.items():
    if op not in ALL_OPS and not isinstance(op, Combiner):
      raise ValueError(f"{owner}: reduce={{{name!r}: {op!r}}}: the reduced dim '{name}' "
                       f"has the unknown op {op!r}; use one of {', '.join(map(repr, ALL_OPS))} "
                       "or a batchpart.Combiner.")
  ops = set(reduce.values())
  if len(ops) > 1:
    combiner = next((op for op in ops if is_combiner(op)), None)
    why = (f"the combiner '{combiner}' reads every result, so it cannot share them with "
           "another op" if combiner else
           "the results would depend on the order of the combinations")
    raise ValueError(f"{owner}: reduce={reduce!r} combines dims with different ops "
                     f"(dims {', '.join(reduce)}); {why}. Use one op for every reduced dim.")
  if ops:
    check_combiner_dims(owner, next(iter(ops)), list(reduce))
  return dict(reduce)


def check_results(owner: str, reductions, shapes, dtypes, layouts) -> None:
  """Refuses results the combining op is not defined on (their dtypes, and
  for a combiner their number and shapes, read by declared core position:
  ``layouts[i]`` is result i's ``(lead, core)``, its core dims before and
  after its batch dims); results that keep a reduced dim do not combine and
  are not checked."""
  op = combining_op(reductions)
  if op is None:
    return
  check_kept_whole(owner, reductions)
  kept = kept_results(reductions)
  layouts = list(layouts)
  combining = [i for i in range(len(shapes)) if i not in kept]
  names = ", ".join(r.name for r in reductions)
  if is_combiner(op):
    check_combining_results(owner, op, names, [
        ResultDims(i, tuple(int(v) for v in shapes[i]), layouts[i][0], layouts[i][1],
                   dtypes[i])
        for i in combining], reductions[0].k_dims)
    return
  for i in combining:
    dtype = np.dtype(dtypes[i])
    if dtype == np.bool_ or (op != "sum" and np.issubdtype(dtype, np.complexfloating)):
      raise ValueError(
          f"{owner}: result {i} has dtype {dtype.name}, which reduce '{op}' over the "
          f"dim(s) {names} cannot combine.")


def lower_combiners(owner: str, reductions, result_shapes, result_core_ranks,
                    result_leads, result_dtypes) -> tuple:
  """``reductions`` with a ``Combiner`` op replaced by its lowered name
  (``combiner.lowered_name``, on one batch element's combining results):
  what a description, and so a derived name, carries."""
  out = []
  for r in reductions:
    if isinstance(r.op, Combiner):
      kept = kept_results(reductions)
      types = [jax.ShapeDtypeStruct(core_shape(s, lead, core), t)
               for i, (s, core, lead, t) in enumerate(zip(result_shapes, result_core_ranks,
                                                          result_leads, result_dtypes))
               if i not in kept]
      r = dataclasses.replace(r, op=lowered_name(
          f"{owner}: reduce {r.op!r} over the dim {r.name}", r.op, types))
    out.append(r)
  return tuple(out)


def splits_reductions(ctx) -> bool:
  """Whether a call lowered here may keep a reduced dim split. Not inside a
  ``shard_map`` manual over some mesh axes only: there XLA hands the
  partitioner the free axes' shardings alone, numbered within one manual
  subgroup, so the per-device all-reduce could not name the devices of the
  whole program. The reduced dims are then core dims like any other
  (gathered or re-batched), as for an uneven split."""
  return not compat.is_partially_manual_lowering(ctx)
