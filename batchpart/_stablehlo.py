"""Reading StableHLO modules (lowered programs, jax.export artifacts).

Relies on the StableHLO jax emits (checked against jax/jaxlib 0.10.2), read
with jax's MLIR Python bindings:
- ``jax.ffi.ffi_call`` and ``batchpart.ffi_call`` lower to
  ``stablehlo.custom_call`` with the FFI attributes in an
  ``mhlo.backend_config`` dictionary (older encodings: ``api_version = 4``);
  batchpart adds ``mhlo.frontend_attributes = {num_batch_dims = "k"}``.
- ``shard_map`` bodies are ``sdy.manual_computation`` regions (Shardy) or
  ``func.call``s whose operands come from ``SPMDFullToShardShape`` custom
  calls (GSPMD).
- an op's location prints as nested ``callsite("fn"("file":line:col ...)
  at ...)``, innermost frame first.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator

from batchpart import _compat as compat, _dtypes
from batchpart._vocab import derived_names

ir = compat.ir

_LOCATION_FRAME = re.compile(r'"((?:[^"\\]|\\.)*)"\("((?:[^"\\]|\\.)*)":(\d+):(\d+)')
# Deeper func.call nesting than this is not followed (a guard against cycles).
_MAX_CALL_DEPTH = 64


def walk(operation) -> Iterator:
  """Every operation nested in ``operation``, depth first."""
  for region in operation.regions:
    for block in region.blocks:
      for op in block.operations:
        yield op
        yield from walk(op.operation)


def string_attribute(attributes, name: str) -> str | None:
  """The value of a string attribute; None if it is absent or not a string."""
  if name not in attributes:
    return None
  try:
    return ir.StringAttr(attributes[name]).value
  except (ValueError, TypeError):
    return None


def frontend_attribute(op, name: str) -> str | None:
  """One entry of an op's ``mhlo.frontend_attributes``, or None."""
  attrs = op.attributes
  if "mhlo.frontend_attributes" not in attrs:
    return None
  try:
    return string_attribute(ir.DictAttr(attrs["mhlo.frontend_attributes"]), name)
  except (ValueError, TypeError):
    return None


def derived_name(op) -> str | None:
  """The derived target name of a batchpart custom call: its target where
  XLA partitions it, else its ``batchpart.derived_name`` frontend attribute;
  None for any other op."""
  target = string_attribute(op.attributes, "call_target_name") or ""
  if derived_names.is_derived(target):
    return target
  return frontend_attribute(op, derived_names.FRONTEND_ATTRIBUTE)


def custom_call_targets(module) -> list[str]:
  """The target names of every ``stablehlo.custom_call`` in ``module`` (an
  MLIR module, or its text or bytecode), in program order."""
  with compat.make_ir_context() as context:
    if isinstance(module, (bytes, str)):
      module = ir.Module.parse(module, context)
    else:
      module = ir.Module.parse(compat.module_to_string(module), context)
    return [string_attribute(op.attributes, "call_target_name") or ""
            for op in walk(module.operation)
            if op.operation.name == "stablehlo.custom_call"]


def is_ffi_call(op) -> bool:
  """Whether ``op`` is a ``stablehlo.custom_call`` in the typed-FFI encoding."""
  if op.name != "stablehlo.custom_call":
    return False
  attrs = op.attributes
  if "mhlo.backend_config" in attrs:
    try:
      ir.DictAttr(attrs["mhlo.backend_config"])
      return True
    except (ValueError, TypeError):
      pass
  if "api_version" in attrs:
    try:
      return ir.IntegerAttr(attrs["api_version"]).value == 4
    except (ValueError, TypeError):
      pass
  return False


def array_type(value) -> tuple[str, tuple[int, ...]]:
  """(NumPy dtype name, shape) of a ranked tensor value; a value of another
  type reads as (its type's text, ())."""
  try:
    t = ir.RankedTensorType(value.type)
  except (ValueError, TypeError):
    return str(value.type), ()
  return _dtypes.from_mlir(str(t.element_type)), tuple(t.shape)


def location_frames(location) -> tuple[tuple[str, str, int, int], ...]:
  """(function, file, line, column) of each Python frame in an op's
  location, innermost first."""
  return tuple((function, file, int(line), int(column))
               for function, file, line, column in _LOCATION_FRAME.findall(str(location)))


@dataclasses.dataclass(frozen=True)
class CustomCall:
  """A ``stablehlo.custom_call`` op and whether it runs in a manual
  (``shard_map``) region."""
  op: ir.Operation
  in_manual_region: bool


def _defined_by_full_to_shard(value) -> bool:
  owner = value.owner
  if isinstance(owner, ir.Block):
    return False
  op = getattr(owner, "operation", owner)
  return (op.name == "stablehlo.custom_call" and
          string_attribute(op.attributes, "call_target_name") == "SPMDFullToShardShape")


def entry_custom_calls(module) -> list[CustomCall]:
  """The custom calls reachable from ``main``, in program order, following
  ``func.call``s into their callees (as XLA inlines them)."""
  funcs = {}
  for op in module.body.operations:
    name = string_attribute(op.operation.attributes, "sym_name")
    if op.operation.name == "func.func" and name:
      funcs[name] = op.operation
  out: list[CustomCall] = []

  def visit_region(region, manual, depth):
    for block in region.blocks:
      for op in block.operations:
        visit(op.operation, manual, depth)

  def visit(op, manual, depth):
    if depth > _MAX_CALL_DEPTH:
      return
    if op.name == "stablehlo.custom_call":
      out.append(CustomCall(op, manual))
      return
    if op.name == "func.call":
      callee = str(op.attributes["callee"]).lstrip("@").strip('"')
      if callee in funcs:
        inner = manual or any(_defined_by_full_to_shard(v) for v in op.operands)
        for region in funcs[callee].regions:
          visit_region(region, inner, depth + 1)
      return
    inner = manual or op.name == "sdy.manual_computation"
    for region in op.regions:
      visit_region(region, inner, depth)

  main = funcs.get("main")
  if main is not None:
    for region in main.regions:
      visit_region(region, False, 0)
  return out


def layouts(op, name: str, shapes) -> tuple:
  """A custom call's `operand_layouts` / `result_layouts` (minor-to-major), or
  the default row-major ones when the attribute is absent."""
  if name not in op.attributes:
    return tuple(tuple(range(len(s) - 1, -1, -1)) for s in shapes)
  return tuple(tuple(int(d) for d in ir.DenseIntElementsAttr(a))  # type: ignore[attr-defined]  # jaxlib's MLIR stubs omit it
               for a in ir.ArrayAttr(op.attributes[name]))


def aliases(op) -> tuple:
  """A custom call's (operand, result) alias pairs, sorted."""
  if "output_operand_aliases" not in op.attributes:
    return ()
  out = []
  for a in ir.ArrayAttr(op.attributes["output_operand_aliases"]):
    alias = compat.hlo.OutputOperandAlias(a)
    result = alias.output_tuple_indices[0] if len(alias.output_tuple_indices) else 0
    out.append((int(alias.operand_index), int(result)))
  return tuple(sorted(out))
