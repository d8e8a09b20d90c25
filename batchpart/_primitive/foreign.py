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

from batchpart import _compat as compat, _stablehlo
from batchpart._frontend.registry import note_called
from batchpart._frontend.signature import BatchSpec, Signature, check_spec
from batchpart._partition import derived_names, targets
from batchpart._primitive.lowering import describe, shardy_rule_attribute

ir = compat.ir


@dataclasses.dataclass(frozen=True)
class BatchDeclaration:
  """How to find the batch dims of an emitted call: ``num_batch_dims`` (an
  int, or a callable of the operand and result shapes) or a signature."""
  owner: str   # what the user wrapped, for messages
  num_batch_dims: int | Callable | None = None
  signature: Signature | None = None
  attribute_rule: str = ""

  def spec(self, target, operand_shapes, result_shapes) -> BatchSpec:
    if self.signature is not None:
      if (len(self.signature.inputs) != len(operand_shapes) or
          len(self.signature.outputs) != len(result_shapes)):
        raise ValueError(
            f"{self.owner}: signature '{self.signature}' has {len(self.signature.inputs)} "
            f"operands and {len(self.signature.outputs)} results, but the emitted call to "
            f"'{target}' has {len(operand_shapes)} and {len(result_shapes)}.")
      return BatchSpec(tuple(len(c) for c in self.signature.inputs),
                       tuple(len(c) for c in self.signature.outputs))
    k = self.num_batch_dims
    if callable(k):
      k = k([tuple(s) for s in operand_shapes], [tuple(s) for s in result_shapes])
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
      raise ValueError(f"{self.owner}: num_batch_dims gave {k!r} for the call to "
                       f"'{target}'; it must be a non-negative int.")
    for what, shapes in (("operand", operand_shapes), ("result", result_shapes)):
      for i, s in enumerate(shapes):
        if len(s) < k:
          raise ValueError(f"{self.owner}: num_batch_dims={k} exceeds the rank of "
                           f"{what} {i} {tuple(s)} of the call to '{target}'.")
    return BatchSpec(tuple(len(s) - k for s in operand_shapes),
                     tuple(len(s) - k for s in result_shapes))


def _shapes(values) -> list[tuple[int, ...]]:
  return [tuple(ir.RankedTensorType(v.type).shape) for v in values]


def _is_typed_ffi_call(op) -> bool:
  """A typed-FFI custom call batchpart has not retargeted yet."""
  target = _stablehlo.string_attribute(op.attributes, "call_target_name") or ""
  return _stablehlo.is_ffi_call(op.operation) and not derived_names.is_derived(target)


def retarget(ctx, op, declaration: BatchDeclaration) -> None:
  """Turns one emitted typed-FFI custom call into a batchpart call."""
  attrs = op.attributes
  target = ir.StringAttr(attrs["call_target_name"]).value
  operand_shapes, result_shapes = _shapes(op.operands), _shapes(op.results)
  spec = declaration.spec(target, operand_shapes, result_shapes)
  batch_shape = check_spec(target, spec, operand_shapes, result_shapes)
  description = describe(
      target, operand_shapes, spec.operand_core_ranks, result_shapes, spec.result_core_ranks,
      input_layouts=_stablehlo.layouts(op, "operand_layouts", operand_shapes),
      output_layouts=_stablehlo.layouts(op, "result_layouts", result_shapes),
      input_output_aliases=_stablehlo.aliases(op),
      has_side_effect=("has_side_effect" in attrs and
                       bool(ir.BoolAttr(attrs["has_side_effect"]).value)),
      attribute_rule=declaration.attribute_rule)
  name = targets.ensure_derived(description, compat.lowering_platforms(ctx),
                                caller=declaration.owner)
  note_called(target)
  frontend = {}
  if "mhlo.frontend_attributes" in attrs:
    frontend = {a.name: a.attr for a in ir.DictAttr(attrs["mhlo.frontend_attributes"])}
  frontend["num_batch_dims"] = ir.StringAttr.get(str(len(batch_shape)))
  attrs["call_target_name"] = ir.StringAttr.get(name)
  attrs["mhlo.frontend_attributes"] = ir.DictAttr.get(frontend)
  if "sdy.sharding_rule" in attrs:
    del attrs["sdy.sharding_rule"]
  rule = shardy_rule_attribute(ctx, operand_shapes, spec.operand_core_ranks, result_shapes,
                               spec.result_core_ranks, batch_shape,
                               [v.type for v in op.operands], [r.type for r in op.results])
  if rule is not None:
    attrs["sdy.sharding_rule"] = rule


def _snapshot(block) -> set[int]:
  return {hash(op.operation) for op in block.operations}


def _new_ops(block, before: set[int]):
  return [op for op in block.operations if hash(op.operation) not in before]


def wrap_rule(rule: Callable, declaration: BatchDeclaration) -> Callable:
  """A lowering rule that runs ``rule`` and retargets the typed-FFI custom
  calls it emitted (also inside regions and functions it created)."""
  def lowering(ctx, *args, **params):
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

  lowering._batchpart_declaration = declaration
  return lowering
