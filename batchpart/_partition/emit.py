"""Emitting a described custom call into the MLIR module being built."""

from __future__ import annotations

from batchpart import _compat as compat
from batchpart._partition.description import CallDescription


def custom_call(name: str, d: CallDescription, operands, result_types, backend_config,
                extra_attributes=None):
  """``stablehlo.custom_call @name`` with the description's layouts, aliases
  and side effect; returns its results. ``backend_config`` is the dict of
  FFI attributes (name -> MLIR attribute)."""
  return compat.custom_call(
      name,
      result_types=list(result_types),
      operands=list(operands),
      backend_config=backend_config,
      api_version=4,
      has_side_effect=d.has_side_effect,
      operand_layouts=[list(l) for l in d.operand_layouts],
      result_layouts=[list(l) for l in d.result_layouts],
      operand_output_aliases=dict(d.aliases) or None,
      extra_attributes=extra_attributes,
  ).results
