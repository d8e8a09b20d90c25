"""Lowering: jax's MLIR emitter and lowering-rule tables, jaxlib's MLIR
bindings, and the Shardy sharding rule builder.

Checked against jax/jaxlib 0.10.2 and 0.12.x (``versions``).

- ``jax._src.interpreters.mlir``: ``register_lowering``, ``custom_call``
  (the emitter ``jax.ffi.ffi_lowering`` uses), the lowering-rule tables
  (``partition_primitive`` wraps another primitive's rules), MLIR contexts
  and types; jaxlib's MLIR bindings (``ir``, ``hlo``, ``func``) build the
  per-device module and read lowered programs.
- ``jax._src.custom_partitioning_sharding_rule``: the Shardy rule builder
  jax's own linalg lowering uses.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from jax._src.custom_partitioning_sharding_rule import (
  ArrayMapping,
  SdyShardingRule,
  sdy_sharding_rule_to_mlir,
)
from jax._src.interpreters import mlir
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import func, hlo as hlo

func_dialect = func   # the name the rest of batchpart reads it by
register_lowering = mlir.register_lowering
custom_call = mlir.custom_call
ir_attribute = mlir.ir_attribute
ir_constant = mlir.ir_constant
aval_to_ir_type = mlir.aval_to_ir_type
dtype_to_ir_type = mlir.dtype_to_ir_type
make_ir_context = mlir.make_ir_context
# Lowers a Python function of the operands inside a rule (a jax callback a
# declaration turns into batchpart's own call).
lower_fun = mlir.lower_fun
module_to_bytecode = mlir.module_to_bytecode
module_to_string = mlir.module_to_string
# The channel a collective inside an SPMD program carries (jax's psum uses
# the same), with global device ids in its replica groups.
COLLECTIVE_CHANNEL_ID = mlir.COLLECTIVE_CHANNEL_ID
DEVICE_TO_DEVICE_TYPE = mlir.DEVICE_TO_DEVICE_TYPE


def lowering_platforms(ctx) -> tuple[str, ...]:
  """The platforms a lowering emits code for (``cpu``, ``cuda``, ...)."""
  return tuple(ctx.module_context.platforms)


def wrap_lowering_rules(primitive, wrap: Callable) -> bool:
  """Replaces each lowering rule registered for ``primitive`` (the default
  one and every platform's) by ``wrap(rule)``; False if it has none."""
  found = False
  tables = [(None, mlir._lowerings)] + list(mlir._platform_specific_lowerings.items())
  for _platform, table in tables:
    entry = table.get(primitive)
    if entry is None:
      continue
    found = True
    table[primitive] = dataclasses.replace(entry, rule=wrap(entry.rule))
  return found


def sdy_sharding_rule(operand_factors, result_factors, operand_types, result_types,
                      need_replication_factors: tuple[str, ...],
                      reduction_factors: tuple[str, ...] = ()) -> ir.Attribute:
  """jax's Shardy rule attribute from one factor name per dim of each operand
  and result (built from mappings, not text: zero results and scalars too)."""
  rule = SdyShardingRule(
      tuple(ArrayMapping(*names) for names in operand_factors),
      tuple(ArrayMapping(*names) for names in result_factors),
      need_replication_factors=tuple(need_replication_factors),
      reduction_factors=tuple(reduction_factors))
  return sdy_sharding_rule_to_mlir(rule, list(operand_types), list(result_types))
