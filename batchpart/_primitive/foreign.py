"""Making the custom calls another lowering rule emits batch partitionable.

A package's primitive lowers through its own rule (typically
``jax.ffi.ffi_lowering``). Wrapped here, the rule runs unchanged; then every
typed-FFI ``stablehlo.custom_call`` it emitted is retargeted, in place, to
its derived name, with the ``num_batch_dims`` frontend attribute and (under
Shardy) batchpart's sharding rule: from then on it is partitioned exactly
like a ``bp.ffi_call``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from batchpart import _compat as compat, _dtypes, _stablehlo
from batchpart._partition import attributes
from batchpart._primitive.lowering import declaration_text, place
from batchpart._vocab.batch_spec import BatchSpec, check_spec
from batchpart._vocab.description import describe
from batchpart._vocab.dims.halo import check_halo_sizes, halo_value
from batchpart._vocab.dims.reduced import check_results
from batchpart._vocab.dims.scan import Scan, check_scan_arrays

ir = compat.ir


@dataclasses.dataclass(frozen=True)
class BatchDeclaration:
  """How to find the batch dims of an emitted call: ``num_batch_dims`` (an
  int, or a callable of the operand and result shapes) or the core ranks of
  a signature; and the per-shard attribute rule, if any."""
  owner: str   # the entry point the user called, for messages
  num_batch_dims: int | Callable | None = None
  core_ranks: BatchSpec | None = None   # from a signature
  signature: str = ""                   # its text, for messages
  attribute_rule: attributes.AttributeRule | None = None

  def text(self) -> str:
    """The declaration as written, for ``batchpart.explain``; "" where
    ``num_batch_dims`` is a function of the shapes."""
    if self.core_ranks is not None:
      reduce = {r.name: r.op for r in self.core_ranks.reductions}
      halo = {h.name: halo_value(h) for h in self.core_ranks.halos}
      scan = {t.name: t.fold if isinstance(t.fold, Scan) else Scan(t.state, reverse=t.reverse)
              for t in self.core_ranks.scans}
      return declaration_text(None, self.signature, reduce, halo, scan)
    return "" if callable(self.num_batch_dims) else declaration_text(self.num_batch_dims, None)

  def spec(self, target, operand_shapes, result_shapes) -> BatchSpec:
    where = f"{self.owner} (its call to '{target}')"
    if self.core_ranks is not None:
      ins, outs = self.core_ranks.operand_core_ranks, self.core_ranks.result_core_ranks
      if len(ins) != len(operand_shapes) or len(outs) != len(result_shapes):
        raise ValueError(
            f"{where}: signature '{self.signature}' has {len(ins)} operands and "
            f"{len(outs)} results, but the emitted call has {len(operand_shapes)} "
            f"operands and {len(result_shapes)} results.")
      return self.core_ranks
    k = self.num_batch_dims
    if callable(k):
      k = k([tuple(s) for s in operand_shapes], [tuple(s) for s in result_shapes])
    if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)) or k < 0:
      raise ValueError(f"{where}: num_batch_dims gave {k!r}; it must be a "
                       "non-negative int.")
    k = int(k)
    for what, shapes in (("operand", operand_shapes), ("result", result_shapes)):
      for i, s in enumerate(shapes):
        if len(s) < k:
          raise ValueError(f"{where}: num_batch_dims={k} exceeds the rank of {what} "
                           f"{i} with shape {tuple(s)}.")
    for what, shapes in (("operand", operand_shapes), ("result", result_shapes)):
      for i, s in enumerate(shapes):
        if operand_shapes and tuple(s[:k]) != tuple(operand_shapes[0][:k]):
          raise ValueError(
              f"{where}: with num_batch_dims={k} every operand and result has the same "
              f"leading {k} dims; {what} {i} has shape {tuple(s)}, operand 0 has "
              f"shape {tuple(operand_shapes[0])}.")
    return BatchSpec(tuple(len(s) - k for s in operand_shapes),
                     tuple(len(s) - k for s in result_shapes))


def _shapes(values) -> list[tuple[int, ...]]:
  return [tuple(ir.RankedTensorType(v.type).shape) for v in values]


def _is_typed_ffi_call(op) -> bool:
  """A typed-FFI custom call batchpart has not retargeted yet."""
  return _stablehlo.is_ffi_call(op.operation) and _stablehlo.derived_name(op) is None


def retarget(ctx, op, declaration: BatchDeclaration) -> None:
  """Turns one emitted typed-FFI custom call into a batchpart call."""
  attrs = op.attributes
  target = ir.StringAttr(attrs["call_target_name"]).value
  operand_shapes, result_shapes = _shapes(op.operands), _shapes(op.results)
  spec = declaration.spec(target, operand_shapes, result_shapes)
  caller = f"{declaration.owner} (its call to '{target}')"
  batch_shape = check_spec(caller, spec, operand_shapes, result_shapes)
  result_dtypes = [_dtypes.from_mlir(str(ir.RankedTensorType(r.type).element_type))
                   for r in op.results]
  check_halo_sizes(caller, spec.halos, operand_shapes, result_shapes)
  operand_dtypes = [_dtypes.from_mlir(str(ir.RankedTensorType(v.type).element_type))
                    for v in op.operands]
  check_scan_arrays(caller, spec.scans, operand_shapes, operand_dtypes, result_shapes,
                    result_dtypes)
  check_results(caller, spec.reductions, result_shapes, result_dtypes,
                list(zip(spec.result_leads, spec.result_core_ranks)))
  rule = declaration.attribute_rule
  description = describe(
      target, operand_shapes, spec.operand_core_ranks, result_shapes, spec.result_core_ranks,
      input_layouts=_stablehlo.layouts(op, "operand_layouts", operand_shapes),
      output_layouts=_stablehlo.layouts(op, "result_layouts", result_shapes),
      input_output_aliases=_stablehlo.aliases(op),
      has_side_effect=("has_side_effect" in attrs and
                       bool(ir.BoolAttr(attrs["has_side_effect"]).value)),
      attribute_rule=rule.digest if rule is not None else "",
      operand_lead_ranks=spec.operand_lead_ranks, result_lead_ranks=spec.result_lead_ranks,
      reductions=spec.reductions, dim_names=spec.dim_names, result_dtypes=result_dtypes,
      owner=caller,
      halos=spec.halos, scans=spec.scans)
  name, extra = place(ctx, description, caller=caller, rule=rule, spec=spec,
                      operand_shapes=operand_shapes, result_shapes=result_shapes,
                      batch_shape=batch_shape, operand_types=[v.type for v in op.operands],
                      result_types=[r.type for r in op.results],
                      declaration=declaration.text())
  frontend: dict[str, ir.Attribute] = {}
  if "mhlo.frontend_attributes" in attrs:
    frontend = {a.name: a.attr for a in ir.DictAttr(attrs["mhlo.frontend_attributes"])}  # type: ignore[attr-defined]  # jaxlib's MLIR stubs omit it
  extra_frontend = ir.DictAttr(extra.pop("mhlo.frontend_attributes"))
  frontend.update({a.name: a.attr for a in extra_frontend})  # type: ignore[attr-defined]  # jaxlib's MLIR stubs omit it
  attrs["call_target_name"] = ir.StringAttr.get(name)
  attrs["mhlo.frontend_attributes"] = ir.DictAttr.get(frontend)
  if "sdy.sharding_rule" in attrs:
    del attrs["sdy.sharding_rule"]
  for key, value in extra.items():
    attrs[key] = value


def _snapshot(block) -> set[int]:
  return {hash(op.operation) for op in block.operations}


def _new_ops(block, before: set[int]):
  return [op for op in block.operations if hash(op.operation) not in before]


def wrap_rule(rule: Callable, declaration_for: Callable) -> Callable:
  """A lowering rule that runs ``rule`` and retargets the typed-FFI custom
  calls it emitted (also inside regions and functions it created) with
  ``declaration_for(params)``, the declaration in force for that call (a
  ``BatchDeclaration``, or None to leave the call exactly as ``rule`` made it)."""
  def lowering(ctx, *args, **params):
    declaration = declaration_for(params)
    if declaration is None:
      return rule(ctx, *args, **params)
    block = ir.InsertionPoint.current.block
    module_body = ctx.module_context.module.body
    before, before_module = _snapshot(block), _snapshot(module_body)
    out = rule(ctx, *args, **params)
    emitted = _new_ops(block, before)
    if module_body != block:
      emitted += _new_ops(module_body, before_module)
    for top in emitted:
      for op in [top, *_stablehlo.walk(top.operation)]:
        if _is_typed_ffi_call(op):
          retarget(ctx, op, declaration)
    return out

  return lowering
