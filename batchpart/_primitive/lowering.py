"""Lowering ``batchpart_ffi_call``: a typed-FFI custom call with a
``num_batch_dims`` frontend attribute, under the derived name that carries its
description where XLA will partition it (with, under Shardy, a sharding
rule), and under the user's own name everywhere else."""

from __future__ import annotations

import dataclasses

import numpy as np

from batchpart import _compat as compat
from batchpart._partition import declared, emit, export, sharding_rule, targets
from batchpart._primitive.primitive import batchpart_ffi_call_p, ffi_call_owner
from batchpart._vocab import derived_names
from batchpart._vocab.batch_spec import BatchSpec, check_spec
from batchpart._vocab.description import CallDescription, describe
from batchpart._vocab.dims.reduced import splits_reductions
from batchpart._vocab.dims.scan import as_halos

#: frontend attribute holding a call's batch declaration as the user wrote it
#: (``signature='(n)->()'``), which the derived name's ranks cannot tell apart
#: from ``num_batch_dims``; read by ``batchpart.explain``.
FRONTEND_DECLARATION = "batchpart.declaration"


def declaration_text(num_batch_dims, signature, reduce=None, halo=None, scan=None) -> str:
  """A batch declaration as the user wrote it: ``"signature='(n)->()',
  reduce={'n': 'sum'}"`` or ``"num_batch_dims=1"``."""
  if signature is not None:
    text = f"signature={signature!r}"
  else:   # np.int64(1) reads as the 1 it means
    k = num_batch_dims
    text = f"num_batch_dims={int(k) if isinstance(k, (int, np.integer)) else repr(k)}"
  if reduce:
    text = f"{text}, reduce={dict(reduce)!r}"
  if halo:
    text = f"{text}, halo={dict(halo)!r}"
  return text if not scan else f"{text}, scan={dict(scan)!r}"


def place(ctx, d: CallDescription, *, caller: str, rule, spec: BatchSpec,
          operand_shapes, result_shapes, batch_shape, operand_types, result_types,
          declaration: str = "") -> tuple[str, dict]:
  """The target name a lowered batchpart call gets and its extra attributes
  (``mhlo.frontend_attributes`` and, under Shardy, ``sdy.sharding_rule``).

  The derived name only where XLA's SPMD partitioner runs, which replaces it
  by the user's target: no executable ever runs a derived name. Elsewhere the
  user's name, with the derived one in a frontend attribute. Lowered for
  ``jax.export``, the functions the description names travel with the call
  (``export.carried_functions``)."""
  if not splits_reductions(ctx):
    # Halo exchanges name devices of the whole program too: kept whole here.
    d = dataclasses.replace(d, reductions=(), halos=(), scans=())
    spec = dataclasses.replace(spec, reductions=(), halos=(), scans=())
  derived = targets.ensure_derived(d, compat.lowering_platforms(ctx), caller=caller,
                                   rule=rule)
  declared.declare(d.target)
  frontend = {"num_batch_dims": str(len(batch_shape))}
  if declaration:
    frontend[FRONTEND_DECLARATION] = declaration
  carried = export.carried_functions(ctx, d)
  if not compat.xla_partitions(ctx):
    frontend[derived_names.FRONTEND_ATTRIBUTE] = derived
    return d.target, {"mhlo.frontend_attributes": compat.ir_attribute(frontend), **carried}
  extra = {"mhlo.frontend_attributes": compat.ir_attribute(frontend), **carried}
  rule_attr = sharding_rule.attribute(ctx, operand_shapes, spec.operand_core_ranks,
                                      result_shapes, spec.result_core_ranks, batch_shape,
                                      operand_types, result_types,
                                      operand_lead_ranks=spec.operand_lead_ranks,
                                      result_lead_ranks=spec.result_lead_ranks,
                                      reductions=spec.reductions,
                                      halos=spec.halos + as_halos(spec.scans))
  if rule_attr is not None:
    extra["sdy.sharding_rule"] = rule_attr
  return derived, extra


def _ir_types(ctx, avals):
  return [compat.aval_to_ir_type(ctx.module_context, a) for a in avals]


def _lowering(ctx, *operands, target_name, operand_core_ranks, result_core_ranks,
              has_side_effect, input_layouts, output_layouts, input_output_aliases,
              attributes, operand_lead_ranks=(), result_lead_ranks=(), reductions=(),
              dim_names=(), halos=(), scans=(), declaration="", **_):
  avals_in, avals_out = ctx.avals_in, ctx.avals_out  # vmapped shapes, if any
  operand_shapes = [a.shape for a in avals_in]
  result_shapes = [a.shape for a in avals_out]
  caller = ffi_call_owner(target_name)
  spec = BatchSpec(operand_core_ranks, result_core_ranks, operand_lead_ranks,
                   result_lead_ranks, reductions=reductions, dim_names=dim_names,
                   halos=halos, scans=scans)
  batch_shape = check_spec(caller, spec, operand_shapes, result_shapes)
  description = describe(
      target_name, operand_shapes, operand_core_ranks, result_shapes, result_core_ranks,
      input_layouts=input_layouts, output_layouts=output_layouts,
      input_output_aliases=input_output_aliases, has_side_effect=has_side_effect,
      operand_lead_ranks=spec.operand_lead_ranks, result_lead_ranks=spec.result_lead_ranks,
      reductions=spec.reductions, dim_names=spec.dim_names,
      result_dtypes=[a.dtype for a in avals_out], halos=spec.halos, scans=spec.scans)
  result_types = _ir_types(ctx, avals_out)
  name, extra = place(ctx, description, caller=caller, rule=None, spec=spec,
                      operand_shapes=operand_shapes, result_shapes=result_shapes,
                      batch_shape=batch_shape, operand_types=_ir_types(ctx, avals_in),
                      result_types=result_types, declaration=declaration)
  attrs = compat.unwrap_kwargs_hashable(tuple((k, v) for k, _, v in attributes))
  config = {k: compat.ir_attribute(v) for k, v in attrs.items()}
  return emit.custom_call(name, description, operands, result_types, config,
                          extra_attributes=extra)


compat.register_lowering(batchpart_ffi_call_p, _lowering)
