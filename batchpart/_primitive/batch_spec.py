"""Batch specs: how many trailing dims of each operand and result are core
dims (everything before them is batch), and the checks every layer shares.

A spec is the one description of a call's batch dims that the primitive, the
lowering, retargeted foreign calls and the partitioner all read. The
frontend builds it from ``num_batch_dims`` or a gufunc signature
(``_frontend/signature``). Every check takes ``owner``, the entry point the
user called (``batchpart.ffi_call('t')``, ``batchpart.partition_primitive('p')``,
...), so a message names what the user wrote.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class BatchSpec:
  """How many trailing dims of each operand and result are core dims."""
  operand_core_ranks: tuple[int, ...]
  result_core_ranks: tuple[int, ...]


def fmt(shape) -> str:
  return str(tuple(int(d) for d in shape))


def require_static_shapes(owner: str, operand_shapes, result_shapes) -> None:
  """batchpart plans on concrete shapes; a symbolic (shape-polymorphic) dim
  is refused by name rather than failing deep inside jax."""
  for what, shapes in (("operand", operand_shapes), ("result", result_shapes)):
    for i, shape in enumerate(shapes):
      if not all(isinstance(d, (int, np.integer)) for d in shape):
        raise NotImplementedError(
            f"{owner}: {what} {i} has the symbolic shape "
            f"({', '.join(map(str, shape))}); shape-polymorphic export of batchpart "
            "calls is not supported. Export with concrete shapes.")


def broadcast_batch_shapes(owner: str, batch_shapes: Sequence[tuple[int, ...]]
                           ) -> tuple[int, ...]:
  """The NumPy broadcast of the operands' batch shapes."""
  rank = max((len(s) for s in batch_shapes), default=0)
  out = [1] * rank
  for k, shape in enumerate(batch_shapes):
    for m, size in enumerate(shape):
      i = rank - len(shape) + m
      if size == out[i] or size == 1:
        continue
      if out[i] == 1:
        out[i] = size
        continue
      raise ValueError(
          f"{owner}: the batch shape {fmt(shape)} of operand {k} does not broadcast "
          f"with the other operands' batch shapes (size {size} against {out[i]}). "
          "Batch dims broadcast NumPy-style: equal sizes, size 1, or missing "
          "leading dims.")
  return tuple(out)


def check_spec(owner: str, spec: BatchSpec, operand_shapes, result_shapes
               ) -> tuple[int, ...]:
  """Checks a spec against (possibly vmapped) shapes; returns the batch shape."""
  if len(spec.operand_core_ranks) != len(operand_shapes) or len(
      spec.result_core_ranks) != len(result_shapes):
    raise ValueError(
        f"{owner}: the declaration has {len(spec.operand_core_ranks)} operands and "
        f"{len(spec.result_core_ranks)} results, but the call has "
        f"{len(operand_shapes)} and {len(result_shapes)}.")
  batch_shapes = []
  for i, (shape, c) in enumerate(zip(operand_shapes, spec.operand_core_ranks)):
    if len(shape) < c:
      raise ValueError(
          f"{owner}: operand {i} with shape {fmt(shape)} has fewer dims than its "
          f"{c} core dims.")
    batch_shapes.append(tuple(shape[:len(shape) - c]))
  batch = broadcast_batch_shapes(owner, batch_shapes)
  for i, (shape, c) in enumerate(zip(result_shapes, spec.result_core_ranks)):
    if len(shape) < c or tuple(shape[:len(shape) - c]) != batch:
      raise ValueError(
          f"{owner}: result {i} with shape {fmt(shape)} does not have the batch "
          f"shape {fmt(batch)} of the operands.")
  return batch
