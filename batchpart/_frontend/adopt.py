"""Adopting batchpart without rewriting a package's calls:
``partition_primitive`` for an existing primitive, ``ffi_lowering`` for
package authors."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable

import jax

from batchpart import _compat as compat
from batchpart._frontend.signature import parse_signature
from batchpart._partition import attributes
from batchpart._primitive import foreign

_lock = threading.Lock()
_wrapped: dict[object, tuple] = {}   # primitive -> its declaration's arguments


def _declaration(owner: str, num_batch_dims, signature, shard_attributes, rule_name: str):
  if (num_batch_dims is None) == (signature is None):
    raise ValueError(f"{owner}: pass exactly one of num_batch_dims and signature "
                     f"(got num_batch_dims={num_batch_dims!r}, signature={signature!r}).")
  if num_batch_dims is not None and not callable(num_batch_dims) and (
      isinstance(num_batch_dims, bool) or not isinstance(num_batch_dims, int) or
      num_batch_dims < 0):
    raise ValueError(f"{owner}: num_batch_dims must be a non-negative int or a callable "
                     f"(operand_shapes, result_shapes) -> int, got {num_batch_dims!r}.")
  if shard_attributes is not None and not callable(shard_attributes):
    raise TypeError(f"{owner}: shard_attributes must be None or a callable "
                    "(attributes, batch_shape) -> dict, got "
                    f"{type(shard_attributes).__name__}.")
  parsed = None if signature is None else parse_signature(signature, target_name=owner)
  if shard_attributes is not None:
    rule_name = re.sub(r"[^A-Za-z0-9_.\-]", "_", rule_name)
    attributes.register_rule(rule_name, shard_attributes)
  return foreign.BatchDeclaration(owner=owner, num_batch_dims=num_batch_dims,
                                  signature=parsed,
                                  attribute_rule=rule_name if shard_attributes else "")


def partition_primitive(primitive, *, num_batch_dims=None, signature: str | None = None,
                        shard_attributes: Callable | None = None):
  """Makes every FFI custom call ``primitive``'s lowering rules emit batch
  partitionable.

  The primitive's lowering rules (the default one and each platform's) keep
  running unchanged; every typed-FFI custom call they emit is then
  partitioned by batchpart, exactly like a :func:`batchpart.ffi_call`: each
  device runs it on its own slice of the batch, whatever the input's
  sharding. Plain uses of the same FFI targets elsewhere are unaffected.

  Args:
    primitive: a JAX primitive whose lowering emits FFI custom calls (e.g.
      ``jax_finufft.ops.nufft1_p``, ``jax.lax.linalg.cholesky_p``).
    num_batch_dims: the number of leading batch dims shared by every operand
      and result of each emitted custom call: an int, or a callable
      ``(operand_shapes, result_shapes) -> int`` evaluated on each emitted
      call's shapes.
    signature: alternatively, a gufunc signature of the emitted custom call.
    shard_attributes: None, or a callable ``(attributes, batch_shape) ->
      dict`` called for each per-device call with the FFI attributes (NumPy
      scalars/arrays, strings) and that device's local batch shape; the
      entries it returns replace those attributes in the per-device call
      (e.g. a batch size passed as an attribute).

  Returns:
    ``primitive`` itself. Calling this again with the same arguments does
    nothing; with different ones it raises ``ValueError`` naming the
    primitive. jax's caches are cleared, so every program lowered from now on
    uses the wrapped rules (executables compiled before are unaffected).

  In Explicit sharding mode the primitive's results are typed with the
  batch sharding of its first operand's leading batch dims.
  """
  owner = f"batchpart.partition_primitive({getattr(primitive, 'name', primitive)!r})"
  if not hasattr(primitive, "bind") or not hasattr(primitive, "name"):
    raise TypeError(f"batchpart.partition_primitive: expected a JAX primitive, got "
                    f"{type(primitive).__name__}.")
  key = (num_batch_dims, signature, getattr(shard_attributes, "__code__", shard_attributes))
  with _lock:
    if primitive in _wrapped:
      if _wrapped[primitive] == key:
        return primitive
      raise ValueError(f"{owner}: the primitive is already partitioned by batchpart with "
                       "other arguments; a primitive is wrapped once.")
    declaration = _declaration(owner, num_batch_dims, signature, shard_attributes,
                               rule_name=f"primitive.{primitive.name}")
    if not compat.wrap_lowering_rules(
        primitive, lambda rule: foreign.wrap_rule(rule, declaration)):
      raise ValueError(f"{owner}: the primitive has no lowering rule to wrap.")
    compat.wrap_abstract_eval(primitive, _explicit_batch_sharding(num_batch_dims,
                                                                  signature is not None))
    _wrapped[primitive] = key
  # jax caches lowerings by jaxpr, and the wrap changes no jaxpr: without this
  # a function traced before would keep its unpartitioned lowering.
  jax.clear_caches()
  return primitive


def _explicit_batch_sharding(num_batch_dims, from_signature: bool):
  """Result types in Explicit mode: the first operand's leading batch
  sharding on each result's leading dims."""
  def retype(avals_in, avals_out):
    if from_signature or not avals_in:
      return avals_out
    k = num_batch_dims
    if callable(k):
      try:
        k = k([tuple(a.shape) for a in avals_in], [tuple(a.shape) for a in avals_out])
      except Exception:  # noqa: BLE001 - a rule for the emitted call's shapes only
        return avals_out
    spec = compat.explicit_spec(avals_in[0])
    if spec is None or not k or all(e is None for e in spec[:k]):
      return avals_out
    return [compat.with_leading_spec(a, spec[:k]) if len(a.shape) >= k and
            tuple(a.shape[:k]) == tuple(avals_in[0].shape[:k]) else a
            for a in avals_out]
  return retype


def ffi_lowering(target_name: str, *, num_batch_dims=None, signature: str | None = None,
                 shard_attributes: Callable | None = None, operand_layouts=None,
                 result_layouts=None, **lowering_args):
  """A drop-in for :func:`jax.ffi.ffi_lowering` whose custom call is batch
  partitionable.

  Takes ``jax.ffi.ffi_lowering``'s arguments plus exactly one of
  ``num_batch_dims`` and ``signature`` and an optional ``shard_attributes``,
  as :func:`batchpart.partition_primitive` does. Register the returned rule
  with ``jax.interpreters.mlir.register_lowering`` as usual.
  """
  owner = f"batchpart.ffi_lowering('{target_name}')"
  declaration = _declaration(owner, num_batch_dims, signature, shard_attributes,
                             rule_name=f"lowering.{target_name}")
  rule = jax.ffi.ffi_lowering(target_name, operand_layouts=operand_layouts,
                              result_layouts=result_layouts, **lowering_args)
  return foreign.wrap_rule(rule, declaration)
