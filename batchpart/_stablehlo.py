"""Reading StableHLO modules (lowered programs, jax.export artifacts)."""

from __future__ import annotations

from collections.abc import Iterator

from batchpart import _compat as compat

ir = compat.ir


def walk(operation) -> Iterator:
  """Every operation nested in ``operation``, depth first."""
  for region in operation.regions:
    for block in region.blocks:
      for op in block.operations:
        yield op
        yield from walk(op.operation)


def string_attribute(attributes, name: str) -> str | None:
  return ir.StringAttr(attributes[name]).value if name in attributes else None


def custom_call_targets(module) -> list[str]:
  """The target names of every ``stablehlo.custom_call`` in ``module`` (an
  MLIR module, or its text or bytecode), in program order."""
  with compat.make_ir_context() as context:
    if isinstance(module, (bytes, str)):
      module = ir.Module.parse(module, context)
    else:
      module = ir.Module.parse(compat.module_to_string(module), context)
    return [string_attribute(op.attributes, "call_target_name")
            for op in walk(module.operation)
            if op.operation.name == "stablehlo.custom_call"]
