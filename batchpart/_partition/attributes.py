"""FFI attributes as XLA hands them to the partitioner (the backend config
text of a typed-FFI call), and per-shard attribute rules."""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np

from batchpart import _compat as compat, _dtypes

ir = compat.ir

_lock = threading.Lock()
_rules: dict[str, Callable] = {}


def register_rule(name: str, rule: Callable) -> None:
  """Binds a per-shard attribute rule ``rule(attributes, local_batch_shape)
  -> {name: new value}`` to ``name``; a name is bound once."""
  with _lock:
    old = _rules.get(name, rule)
    if getattr(old, "__code__", old) is not getattr(rule, "__code__", rule):
      raise ValueError(f"batchpart: attribute rule '{name}' is already bound to "
                       "another function")
    _rules[name] = rule


def rule(name: str) -> Callable:
  with _lock:
    if name not in _rules:
      raise RuntimeError(
          f"batchpart: a call needs the per-shard attribute rule '{name}', which is not "
          "registered in this process (call batchpart.partition_primitive on the "
          "primitive again before compiling a deserialized program).")
    return _rules[name]


def parse(config) -> dict:
  """``{name: MLIR attribute}`` of a typed-FFI backend config (call it inside
  an MLIR context)."""
  text = (config.decode() if isinstance(config, bytes) else str(config)).strip()
  if not text:
    return {}
  parsed = ir.DictAttr(ir.Attribute.parse(text))
  return {named.name: named.attr for named in parsed}


def to_python(attr):
  """A Python/NumPy value of a scalar, string or array attribute."""
  if isinstance(attr, ir.BoolAttr):
    return bool(attr.value)
  if isinstance(attr, (ir.IntegerAttr, ir.FloatAttr)):
    return np.dtype(_dtypes.from_mlir(str(attr.type))).type(attr.value)
  if isinstance(attr, ir.StringAttr):
    return attr.value
  if isinstance(attr, (ir.DenseIntElementsAttr, ir.DenseFPElementsAttr)):
    return np.array(attr)
  return attr  # left as MLIR: rules may still pass it through
