"""jax's own host callbacks in a compiled program: which entry point made a
call, and whether XLA runs it on one device only.

jax gives ``jax.pure_callback``, ``jax.experimental.io_callback`` and
``jax.debug.callback`` a maximal sharding (``{maximal device=0}``); XLA's
partitioner, under Shardy and GSPMD alike, then puts the call in the true
branch of a ``conditional`` on ``partition-id() == 0`` and all-gathers every
operand in front of it. ``jax.experimental.buffer_callback`` carries no
sharding, so every device runs it on the gathered arrays. Checked against
the programs jax/jaxlib 0.10.2 compile.
"""

from __future__ import annotations

import re

from batchpart import _hlo

# jax's host-callback targets: ``xla_ffi[_partitioned]_python_{cpu,gpu}_callback``
# (pure, io and debug callbacks) and ``xla_buffer_python_{cpu,gpu}_callback``.
_STOCK_TARGET = re.compile(r"^xla_(?:ffi(?:_partitioned)?|buffer)_python_(?:cpu|gpu)_callback$")

# The jax primitive an op name ends in -> the entry point users call.
_ENTRY_POINTS = {
    "pure_callback": "jax.pure_callback",
    "io_callback": "jax.experimental.io_callback",
    "debug_callback": "jax.debug.callback",
    "buffer_callback": "jax.experimental.buffer_callback",
}
_PRIMITIVE = re.compile(r"\b(" + "|".join(_ENTRY_POINTS) + r")\b")
_CONSTANT = re.compile(r"\bconstant\((\d+)\)")


def is_stock_target(target: str | None) -> bool:
  """Whether ``target`` is one of jax's host-callback targets."""
  return target is not None and _STOCK_TARGET.match(target) is not None


def entry_point(target: str, op_name: str, *, ordered: bool = False) -> str:
  """How a stock callback was made (``"jax.pure_callback"``), read off the
  primitive in the op name jax gives it; ``ordered`` marks an ``io_callback``
  that threads a token."""
  found = _PRIMITIVE.findall(op_name or "")
  name = _ENTRY_POINTS[found[-1]] if found else f"jax host callback ({target})"
  return f"{name} (ordered)" if ordered else name


def single_device(module: _hlo.Module, call: _hlo.Instruction
                  ) -> tuple[_hlo.Instruction, int] | None:
  """``(conditional, device)`` where ``call`` sits in the true branch of a
  conditional taken on one partition only (``partition-id() == device``):
  XLA's rendering of a maximal sharding. None where every device runs it."""
  branch = module.computation_of.get(call.name)
  for inst in module.all_instructions():
    if inst.opcode != "conditional" or not inst.called or inst.called[0] != branch:
      continue
    operands = module.operands(inst)
    device = _partition_test(module, operands[0]) if operands else None
    if device is not None:
      return inst, device
  return None


def _partition_test(module: _hlo.Module, pred: _hlo.Instruction) -> int | None:
  """k where ``pred`` computes ``partition-id() == k`` (as one compare or a
  fusion holding just that compare), else None."""
  if pred.opcode == "fusion":
    body = [i for i in module.called_instructions(pred) if i.opcode != "parameter"]
    if len(body) != 1 or body[0].opcode != "compare":
      return None
    compare = body[0]
  elif pred.opcode == "compare":
    compare = pred
  else:
    return None
  if "direction=EQ" not in compare.text:
    return None
  inputs = module.operands(pred)
  constants = [i for i in inputs if i.opcode == "constant"]
  if len(inputs) != 2 or len(constants) != 1 or not any(
      i.opcode == "partition-id" for i in inputs):
    return None
  value = _CONSTANT.search(constants[0].text)
  return int(value.group(1)) if value else None
