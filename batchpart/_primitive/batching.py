"""vmap of ``batchpart_ffi_call``: the mapped axis becomes one more leading
batch dim of the same call."""

from __future__ import annotations

from jax import lax

from batchpart import _compat as compat
from batchpart._primitive.primitive import batchpart_ffi_call_p


def _shift_layout(layout, new_dims: int = 1):
  """Minor-to-major layout of an array that gained ``new_dims`` leading (most
  major) dims."""
  return tuple(n + new_dims for n in layout) + tuple(range(new_dims - 1, -1, -1))


def _batching_rule(args, dims, *, result_avals, input_layouts, output_layouts,
                   input_output_aliases, broadcast_batch, **params):
  size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
  core_ranks = params["operand_core_ranks"]
  unmapped_batch_ranks = [len(a.shape) - c - (d is not None)
                          for a, c, d in zip(args, core_ranks, dims)]
  rank = max(unmapped_batch_ranks, default=0)
  args = [a if d is None else compat.moveaxis(a, d, 0) for a, d in zip(args, dims)]
  dims = list(dims)
  # An aliased operand must have its result's shape, and under
  # num_batch_dims every operand has the full batch shape: materialise the
  # new dim for those.
  must_broadcast = {i for i, _ in input_output_aliases}
  if not broadcast_batch:
    must_broadcast = set(range(len(args)))
  for i in must_broadcast:
    if dims[i] is None:
      args[i] = lax.broadcast(args[i], (size,))
      dims[i] = 0
  input_layouts = list(input_layouts)
  for i, (a, d, b) in enumerate(zip(args, dims, unmapped_batch_ranks)):
    if d is None:
      continue  # a missing leading dim: broadcast, right-aligned
    # The mapped dim must line up with the new leading batch dim, so an
    # operand with fewer batch dims gets size-1 (broadcast) dims after it.
    pad = rank - b
    if pad:
      args[i] = lax.expand_dims(a, tuple(range(1, pad + 1)))
    input_layouts[i] = _shift_layout(input_layouts[i], pad + 1)
  output_layouts = tuple(_shift_layout(l) for l in output_layouts)
  result_avals = tuple(r.update(shape=(size, *r.shape)) for r in result_avals)
  outs = batchpart_ffi_call_p.bind(
      *args, result_avals=result_avals, input_layouts=tuple(input_layouts),
      output_layouts=output_layouts, input_output_aliases=input_output_aliases,
      broadcast_batch=broadcast_batch, **params)
  return outs, [0] * len(outs)


compat.primitive_batchers[batchpart_ffi_call_p] = _batching_rule
