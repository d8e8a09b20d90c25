"""Reduced core dims: ``reduce={"n": "sum"}``.

A reduced dim is a core dim of the operands that no result has, over which
every result *combines*: each result equals the reduction (sum, max or min),
over any split of that dim into parts, of the results computed on the parts
(a dot over its contraction dim, a NUFFT type 1 over its points, a
log-likelihood over its data). Where that dim is sharded, each device runs
the call on its own part and one all-reduce combines the results.

A reduction names its dim by each operand's core axis: ``>= 0`` counts the
core dims before the operand's batch dims (a signature's ``...``), ``< 0``
the trailing ones from the end. Both are invariant under vmap, which adds
batch dims between them.
"""

from __future__ import annotations

import dataclasses

import numpy as np

OPS = ("sum", "max", "min")


@dataclasses.dataclass(frozen=True)
class Reduction:
  """One reduced dim: its signature name, the op, and where each operand
  that has it holds it, as ``(operand, core axis)`` pairs."""
  name: str
  op: str
  dims: tuple[tuple[int, int], ...]


@dataclasses.dataclass(frozen=True)
class DimName:
  """Where a named core dim first appears: ``kind`` "o" (operand) or "r"
  (result), the array's index and its core axis (as in ``Reduction``)."""
  name: str
  kind: str
  index: int
  axis: int


def absolute_dim(axis: int, rank: int) -> int:
  """An array dim from a core axis (``>= 0`` leading, ``< 0`` trailing)."""
  return axis if axis >= 0 else rank + axis


def reduced_dims_table(reductions, operand_ranks) -> list[list[int]]:
  """Per operand, per dim: the index of the reduction that dim belongs to,
  or -1 (the planner's ``operand_reduced_dims``); ``[]`` without any."""
  if not reductions:
    return []
  table = [[-1] * int(r) for r in operand_ranks]
  for i, reduction in enumerate(reductions):
    for k, axis in reduction.dims:
      table[k][absolute_dim(axis, len(table[k]))] = i
  return table


def combining_op(reductions) -> str | None:
  """The op that combines the results (every reduction has the same one)."""
  return reductions[0].op if reductions else None


def check_reduce_mapping(owner: str, reduce) -> dict[str, str]:
  """``reduce`` as a dict of dim name -> op, checked for shape."""
  if not isinstance(reduce, dict) or not all(isinstance(k, str) for k in reduce):
    raise TypeError(f"{owner}: reduce must be a dict of core dim name -> op "
                    f"({', '.join(map(repr, OPS))}), e.g. reduce={{'n': 'sum'}}; got "
                    f"{reduce!r}.")
  for name, op in reduce.items():
    if op not in OPS:
      raise ValueError(f"{owner}: reduce={{{name!r}: {op!r}}}: the reduced dim '{name}' "
                       f"has the unknown op {op!r}; use one of {', '.join(map(repr, OPS))}.")
  if len(set(reduce.values())) > 1:
    raise ValueError(
        f"{owner}: reduce={reduce!r} combines dims with different ops; the results "
        "would depend on the order of the combinations. Use one op for every reduced dim.")
  return dict(reduce)


def check_result_dtypes(owner: str, reductions, dtypes) -> None:
  """Refuses results the combining op is not defined on."""
  op = combining_op(reductions)
  if op is None:
    return
  names = ", ".join(r.name for r in reductions)
  for i, dtype in enumerate(dtypes):
    dtype = np.dtype(dtype)
    if dtype == np.bool_ or (op != "sum" and np.issubdtype(dtype, np.complexfloating)):
      raise ValueError(
          f"{owner}: result {i} has dtype {dtype.name}, which reduce '{op}' over the "
          f"dim(s) {names} cannot combine.")
