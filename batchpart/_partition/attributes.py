"""FFI attributes as XLA hands them to the partitioner (the backend config
text of a typed-FFI call), and per-shard attribute rules."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import threading
from collections.abc import Callable

import numpy as np

from batchpart import _compat as compat, _dtypes
from batchpart._partition import rule_digest

ir = compat.ir

_lock = threading.Lock()
# digest -> the first rule declared with that digest, for derived names read
# from a module (a deserialized export) rather than lowered here. Bounded by
# the number of distinct rules; the partitioner callbacks of derived names
# hold their rules for the process's life anyway.
_by_digest: dict[str, Callable] = {}


@dataclasses.dataclass(frozen=True, eq=False)
class AttributeRule:
  """A per-shard attribute rule ``fn(attributes, local_batch_shape) ->
  {name: new value}`` (or ``fn(attributes, local_batch_shape, core_sizes)``,
  ``core_sizes`` the local size of each named core dim) and the digest of
  what it computes (its identity in derived target names)."""
  fn: Callable
  digest: str

  @functools.cached_property
  def takes_core_sizes(self) -> bool:
    """Whether ``fn`` accepts a third positional argument."""
    return takes_core_sizes(self.fn)

  def call(self, values: dict, batch_shape: tuple, core_sizes: dict):
    if self.takes_core_sizes:
      return self.fn(values, batch_shape, dict(core_sizes))
    return self.fn(values, batch_shape)


def takes_core_sizes(fn: Callable) -> bool:
  """Whether a rule accepts ``(attributes, batch_shape, core_sizes)``: three
  positional parameters without defaults, or ``*args``. Two-parameter rules
  keep their call, and so do rules whose third parameter has a default (a
  value bound as ``lambda attrs, batch, f=factor: ...``)."""
  try:
    params = list(inspect.signature(fn).parameters.values())
  except (TypeError, ValueError):   # builtins without a signature: the old call
    return False
  if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params):
    return True
  positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
  return sum(p.kind in positional and p.default is inspect.Parameter.empty
             for p in params) >= 3


def make_rule(fn: Callable, *, owner: str) -> AttributeRule:
  """Digests ``fn`` (``owner`` names the declaration in errors)."""
  rule = AttributeRule(fn, rule_digest.digest(fn, owner=owner))
  with _lock:
    _by_digest.setdefault(rule.digest, fn)
  return rule


def rule_for_digest(digest: str, *, target: str) -> AttributeRule:
  """A live rule with ``digest``, for a derived name read from a module."""
  with _lock:
    fn = _by_digest.get(digest)
  if fn is None:
    raise RuntimeError(
        f"batchpart: a call to FFI target '{target}' needs the per-shard attribute rule "
        f"with digest {digest}, and no rule declared in this process has it. Declare the "
        "same rule (batchpart.partition_primitive or batchpart.ffi_lowering with its "
        "shard_attributes) before compiling the deserialized program.")
  return AttributeRule(fn, digest)


def parse(config) -> dict:
  """``{name: MLIR attribute}`` of a typed-FFI backend config (call it inside
  an MLIR context)."""
  text = (config.decode() if isinstance(config, bytes) else str(config)).strip()
  if not text:
    return {}
  parsed = ir.DictAttr(ir.Attribute.parse(text))
  return {named.name: named.attr for named in parsed}  # type: ignore[attr-defined]  # jaxlib's MLIR stubs omit it


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
