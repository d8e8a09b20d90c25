"""vmap of ``batchpart_ffi_call``: the mapped axis becomes one more batch dim
of the same call, the first of them (where a signature's ``...`` stands)."""

from __future__ import annotations

from typing import Any

from jax import lax

from batchpart import _compat as compat
from batchpart._primitive.primitive import batchpart_ffi_call_p


def _shift_layout(layout, new_dims: int = 1):
  """Minor-to-major layout of an array that gained ``new_dims`` leading (most
  major) dims."""
  return tuple(n + new_dims for n in layout) + tuple(range(new_dims - 1, -1, -1))


def _insert_layout(layout, at: int, new_dims: int = 1):
  """Minor-to-major layout of an array that gained ``new_dims`` dims at
  position ``at``. In front they are the most major (as they always were);
  elsewhere they sit just more major than the dim that follows them (the most
  minor where none does), so a row-major layout stays row-major."""
  if at == 0:
    return _shift_layout(layout, new_dims)
  shifted = [d + new_dims if d >= at else d for d in layout]
  new = list(range(at + new_dims - 1, at - 1, -1))
  if at >= len(layout):
    return tuple(new + shifted)
  i = shifted.index(at + new_dims) + 1
  return tuple(shifted[:i] + new + shifted[i:])


def align_operands(args, dims, core_ranks, leads, size: int, must_broadcast):
  """Operands of a vmapped call with the mapped dim as their first batch dim
  (at each operand's ``leads``, where a signature's ``...`` stands):
  operands in ``must_broadcast`` get the new dim materialised, and a mapped
  operand with fewer batch dims than the call gets size-1 (broadcast) dims
  after it. Returns the operands and, per operand, how many dims were
  inserted at its lead (None for one left unmapped, its batch dims
  right-aligned)."""
  unmapped_batch_ranks = [len(a.shape) - c - lead - (d is not None)
                          for a, c, lead, d in zip(args, core_ranks, leads, dims)]
  rank = max(unmapped_batch_ranks, default=0)
  args = [a if d is None else compat.moveaxis(a, d, lead)
          for a, d, lead in zip(args, dims, leads)]
  dims = list(dims)
  for i in must_broadcast:
    if dims[i] is None:
      args[i] = compat.moveaxis(lax.broadcast(args[i], (size,)), 0, leads[i])
      dims[i] = leads[i]
  inserted: list[Any] = []
  for i, (a, d, b, lead) in enumerate(zip(args, dims, unmapped_batch_ranks, leads)):
    if d is None:
      inserted.append(None)
      continue
    pad = rank - b
    if pad:
      args[i] = lax.expand_dims(a, tuple(range(lead + 1, lead + pad + 1)))
    inserted.append(pad + 1)
  return args, inserted


def _batching_rule(args, dims, *, result_avals, input_layouts, output_layouts,
                   input_output_aliases, broadcast_batch, **params):
  size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
  leads = params.get("operand_lead_ranks") or (0,) * len(args)
  result_leads = params.get("result_lead_ranks") or (0,) * len(result_avals)
  # An aliased operand must have its result's shape, and under
  # num_batch_dims every operand has the full batch shape: materialise the
  # new dim for those.
  must_broadcast = {i for i, _ in input_output_aliases}
  if not broadcast_batch:
    must_broadcast = set(range(len(args)))
  args, inserted = align_operands(args, dims, params["operand_core_ranks"], leads, size,
                                  must_broadcast)
  input_layouts = tuple(layout if n is None else _insert_layout(layout, lead, n)
                        for layout, lead, n in zip(input_layouts, leads, inserted))
  output_layouts = tuple(_insert_layout(layout, lead)
                         for layout, lead in zip(output_layouts, result_leads))
  result_avals = tuple(r.update(shape=(*r.shape[:lead], size, *r.shape[lead:]))
                       for r, lead in zip(result_avals, result_leads))
  outs = batchpart_ffi_call_p.bind(
      *args, result_avals=result_avals, input_layouts=input_layouts,
      output_layouts=output_layouts, input_output_aliases=input_output_aliases,
      broadcast_batch=broadcast_batch, **params)
  return outs, list(result_leads)


compat.primitive_batchers[batchpart_ffi_call_p] = _batching_rule
