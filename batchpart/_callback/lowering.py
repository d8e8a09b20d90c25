"""Lowering ``batchpart_callback``: jax's typed-FFI host callback custom call
(``xla_ffi_python_cpu_callback``, ``..._gpu_callback`` on CUDA/ROCm) with a
``HostCall`` registered in the module's host callbacks, and one leading
operand, the block vector (offsets in the global batch, then the local batch
shape).

Where XLA partitions the call, it is emitted under a derived name whose
description carries ``callback_partitions``, so batchpart's partitioner
replaces it by the same jax target on local blocks, the block vector read
from a per-partition table (``_vocab/blocks``). Everywhere else (one device,
a fully manual ``shard_map``) it calls jax's target directly with the whole
block: offsets zero, no padding. jax's target has an ``instantiate`` stage that
cannot be registered again under another name, so a derived name is never
left in an executable (as for every batchpart call).

``bp.buffer_callback`` binds the same primitive with ``buffer=True``: jax's
in-place target (``xla_buffer_python_{cpu,gpu}_callback``) instead, a
``BufferHostCall``, and its operand-to-result aliases (shifted past the
block vector).
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from batchpart import _compat as compat
from batchpart._callback.agreement import Agreement
from batchpart._callback.buffer_host import BufferHostCall
from batchpart._callback.host import HostCall
from batchpart._callback.primitive import batchpart_callback_p
from batchpart._partition import emit, sharding_rule, targets
from batchpart._primitive.lowering import FRONTEND_DECLARATION
from batchpart._vocab import derived_names
from batchpart._vocab.batch_spec import BatchSpec, check_spec
from batchpart._vocab.blocks import whole_block
from batchpart._vocab.description import describe, without_unit_batch
from batchpart._vocab.dims.core import absolute_dim
from batchpart._vocab.dims.scan import as_halos

ir = compat.ir
hlo = compat.hlo
FRONTEND_CALLBACK = "batchpart.callback"


def _unit(aval):
  """``aval`` with a leading dim of size 1; in Explicit mode its sharding
  spec moves with the dims it names."""
  sharding = getattr(aval, "sharding", None)
  spec = getattr(sharding, "spec", None)
  if spec is None:
    return aval.update(shape=(1, *aval.shape))
  return aval.update(shape=(1, *aval.shape),
                     sharding=sharding.update(spec=type(spec)(None, *spec)))


def _with_unit_dim(values, avals, ctx):
  return [hlo.reshape(compat.aval_to_ir_type(ctx.module_context, _unit(a)), v)
          for v, a in zip(values, avals)]


def halo_dims_of_results(halos, result_shapes) -> tuple:
  """Per halo (or scanned) dim, its dim in each result (absolute, in the
  shapes the call has here), None in a result without it (a scan's
  summary)."""
  def dim(h, k, s):
    axis = dict(h.result_dims).get(k)
    return None if axis is None else absolute_dim(axis, len(s))
  return tuple(tuple(dim(h, k, s) for k, s in enumerate(result_shapes)) for h in halos)


def _agreement(platform: str, partitions: int, partitioned: bool,
               reductions, scans=()) -> Agreement | None:
  """How the devices of one execution of the lowered callback learn of each
  other's failures (``agreement``): where XLA partitions the call on the CPU
  devices of one process; None elsewhere. A fully manual region's calls are
  the user's to match; another process's devices cannot be waited for here;
  and a GPU's host callbacks run on threads whose waiting has not been
  checked. With reductions the devices of a reduce group share a block
  vector, so rounds are counted rather than keyed by it. A sequential scan
  calls on one part's devices at a time, so no round of every device forms:
  none there."""
  if (not partitioned or partitions < 2 or platform != "cpu" or jax.process_count() > 1
      or any(not s.parallel for s in scans)):
    return None
  return Agreement(partitions, keyed=not reductions)


def _lowering(ctx, *operands, callback, operand_core_ranks, result_core_ranks, io,
              reductions=(), halos=(), scans=(), declaration="", buffer=False,
              input_output_aliases=(), **_):
  platforms = compat.lowering_platforms(ctx)
  if len(platforms) != 1:
    raise NotImplementedError(f"{callback.owner}: multi-platform lowering of host "
                              f"callbacks is not supported (got {platforms}).")
  target = (compat.buffer_callback_target(platforms[0]) if buffer
            else compat.host_callback_target(platforms[0]))
  if target is None:
    raise NotImplementedError(f"{callback.owner}: jax has no buffer callback on "
                              f"{platforms[0]}.")
  if compat.is_partially_manual_lowering(ctx):
    raise NotImplementedError(
        f"{callback.owner}: host callbacks inside a shard_map over some mesh axes only "
        "(axis_names=...) are not supported, as for jax's callbacks. Call it outside the "
        "shard_map, or make the shard_map manual over every mesh axis.")
  avals_in, avals_out = list(ctx.avals_in), list(ctx.avals_out)
  spec = BatchSpec(operand_core_ranks, result_core_ranks)
  batch = check_spec(callback.owner, spec, [a.shape for a in avals_in],
                     [a.shape for a in avals_out])
  operands = user_operands = list(operands)
  unit = not batch
  if unit:
    # No batch dims: give the call one of size 1, so that where XLA would
    # replicate it, one device computes it and the others get padding. Only
    # XLA's partitioner sees that dim: the call each device makes (and the
    # call here, where nothing is partitioned) has the user's shapes.
    operands = _with_unit_dim(operands, avals_in, ctx)
    avals_in = [_unit(a) for a in avals_in]
    avals_out = [_unit(a) for a in avals_out]
    batch = (1,)
  operand_shapes = [tuple(a.shape) for a in avals_in]
  result_shapes = [tuple(a.shape) for a in avals_out]
  rank = len(batch)
  operand_batch_ranks = [len(s) - c for s, c in zip(operand_shapes, operand_core_ranks)]
  partitions = compat.num_partitions(ctx)
  partitioned = compat.xla_partitions(ctx)
  host_call = BufferHostCall if buffer else HostCall
  halo_dims = halo_dims_of_results(halos, result_shapes)
  # Only a HostCall reads reduced parts, kept dims, halo windows and scanned
  # parts: a buffer callback takes none of reduce=, halo= and scan=.
  parts_kw = {} if buffer else {
      "reduced": len(reductions), "halos": halo_dims,
      "scans": halo_dims_of_results(scans, result_shapes),
      "kept": [(j, absolute_dim(at, len(result_shapes[j])), i)
               for i, r in enumerate(reductions) for j, at in r.results]}
  host = host_call(callback, batch=batch, operand_shapes=operand_shapes,
                   operand_batch_ranks=operand_batch_ranks, result_shapes=result_shapes,
                   result_dtypes=[a.dtype for a in avals_out], unit=unit,
                   agreement=_agreement(platforms[0], partitions, partitioned, reductions,
                                        scans),
                   **parts_kw)
  index = compat.add_host_callback(ctx, host)
  reduced_sizes = [operand_shapes[k][absolute_dim(axis, len(operand_shapes[k]))]
                   for k, axis in (r.dims[0] for r in reductions)]
  halo_sizes = [result_shapes[0][dims[0]] for dims in halo_dims]
  # The block vector carries a scanned dim's part as a halo dim's window of
  # width 0 (``_vocab/blocks``).
  halo_sizes += [operand_shapes[k][absolute_dim(axis, len(operand_shapes[k]))]
                 for k, axis in (t.operand_dims[0] for t in scans)]
  whole = whole_block(batch, reduced_sizes, (*halos, *as_halos(scans)), halo_sizes)
  block, block_shape = compat.ir_constant(whole), whole.shape
  core = (1, *operand_core_ranks)
  # Operand 0 of the custom call is the block vector.
  aliases = tuple((i + 1, o) for i, o in input_output_aliases)
  reductions = tuple(dataclasses.replace(r, dims=tuple((k + 1, a) for k, a in r.dims))
                     for r in reductions)
  halos = tuple(dataclasses.replace(h, operand_dims=tuple((k + 1, a) for k, a in h.operand_dims))
                for h in halos)
  scans = tuple(dataclasses.replace(t, state=(t.state[0] + 1, t.state[1]), operand_dims=tuple(
      (k + 1, a) for k, a in t.operand_dims)) for t in scans)
  d = describe(target, [block_shape, *operand_shapes], core, result_shapes,
               result_core_ranks,
               input_layouts=[(0,)] + [tuple(range(len(s) - 1, -1, -1))
                                       for s in operand_shapes],
               output_layouts=[tuple(range(len(s) - 1, -1, -1)) for s in result_shapes],
               input_output_aliases=aliases, has_side_effect=io, reductions=reductions,
               result_dtypes=[a.dtype for a in avals_out], halos=halos, scans=scans,
               owner=callback.owner)
  d = type(d)(**{**d.__dict__, "callback_partitions": max(partitions, 1), "unit_batch": unit})
  frontend = {"num_batch_dims": str(0 if unit else rank), FRONTEND_CALLBACK: callback.owner}
  if declaration:
    frontend[FRONTEND_DECLARATION] = declaration
  extra = {}
  result_types = [compat.aval_to_ir_type(ctx.module_context, a) for a in avals_out]
  if partitioned:
    name = targets.ensure_derived(d, platforms, caller=callback.owner)
    operand_types = [ir.RankedTensorType.get(list(block_shape),
                                             ir.IntegerType.get_signless(64))]
    operand_types += [compat.aval_to_ir_type(ctx.module_context, a) for a in avals_in]
    rule = sharding_rule.attribute(
        ctx, [block_shape, *operand_shapes], core, result_shapes, result_core_ranks,
        batch, operand_types, result_types, reductions=reductions,
        halos=(*halos, *as_halos(scans)))
    if rule is not None:
      extra["sdy.sharding_rule"] = rule
  else:
    frontend[derived_names.FRONTEND_ATTRIBUTE] = derived_names.encode(d)
  extra["mhlo.frontend_attributes"] = compat.ir_attribute(frontend)
  config = {"index": compat.ir_attribute(np.uint64(index))}
  if not partitioned:
    return list(emit.custom_call(
        target, without_unit_batch(d) if unit else d, [block, *user_operands],
        [compat.aval_to_ir_type(ctx.module_context, a) for a in ctx.avals_out], config,
        extra_attributes=extra))
  results = emit.custom_call(name, d, [block, *operands], result_types, config,
                             extra_attributes=extra)
  if unit:
    results = [hlo.reshape(compat.aval_to_ir_type(ctx.module_context, a), r)
               for a, r in zip(ctx.avals_out, results)]
  return list(results)


compat.register_uncached_lowering(batchpart_callback_p, _lowering)
