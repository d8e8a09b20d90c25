"""Adopting batchpart without rewriting a package's calls:
``partition_primitive`` for an existing primitive, ``ffi_lowering`` for
package authors."""

from __future__ import annotations

import threading
from collections.abc import Callable

import jax

from batchpart import _compat as compat
from batchpart._frontend.signature import batch_rank, parse_signature
from batchpart._partition import attributes
from batchpart._primitive import foreign
from batchpart._primitive.batch_spec import BatchSpec

_lock = threading.Lock()
_wrapped: dict[object, foreign.BatchDeclaration] = {}   # primitive -> its declaration


def _declaration(owner: str, num_batch_dims, signature, shard_attributes
                 ) -> foreign.BatchDeclaration:
  """The checked declaration of a ``partition_primitive`` / ``ffi_lowering``
  call (``owner`` names it in errors)."""
  if (num_batch_dims is None) == (signature is None):
    raise ValueError(f"{owner}: pass exactly one of num_batch_dims and signature "
                     f"(got num_batch_dims={num_batch_dims!r}, signature={signature!r}).")
  if num_batch_dims is not None and not callable(num_batch_dims):
    num_batch_dims = batch_rank(owner, num_batch_dims)
  if shard_attributes is not None and not callable(shard_attributes):
    raise TypeError(f"{owner}: shard_attributes must be None or a callable "
                    "(attributes, batch_shape) -> dict, got "
                    f"{type(shard_attributes).__name__}.")
  core_ranks = None
  if signature is not None:
    parsed = parse_signature(signature, owner=owner)
    core_ranks = BatchSpec(tuple(len(c) for c in parsed.inputs),
                           tuple(len(c) for c in parsed.outputs))
  rule = (None if shard_attributes is None else
          attributes.make_rule(shard_attributes, owner=owner))
  return foreign.BatchDeclaration(owner=owner, num_batch_dims=num_batch_dims,
                                  core_ranks=core_ranks, signature=signature or "",
                                  attribute_rule=rule)


def _same_declaration(a: foreign.BatchDeclaration, b: foreign.BatchDeclaration) -> bool:
  """Whether two declarations partition every call alike: equal batch specs
  and attribute rules with one content digest."""
  digest = lambda d: d.attribute_rule.digest if d.attribute_rule else ""
  same_k = (a.num_batch_dims is b.num_batch_dims or
            (not callable(a.num_batch_dims) and a.num_batch_dims == b.num_batch_dims))
  return same_k and a.core_ranks == b.core_ranks and digest(a) == digest(b)


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
      (e.g. a batch size passed as an attribute). A rule is identified by
      what it computes: a digest of its code, defaults, captured values and
      the globals it reads. A changed rule (a fix, another closure of one
      factory) gives new derived target names, so neither batchpart's
      partition cache nor jax's persistent compilation cache can serve a
      program partitioned with the old one. A rule that captures a value
      batchpart cannot digest raises ``TypeError``; give it a string
      ``__batchpart_key__`` attribute that changes whenever it does.

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
  declaration = _declaration(owner, num_batch_dims, signature, shard_attributes)
  with _lock:
    if primitive in _wrapped:
      if _same_declaration(_wrapped[primitive], declaration):
        return primitive
      raise ValueError(f"{owner}: the primitive is already partitioned by batchpart with "
                       "another declaration (batch dims or shard_attributes rule); a "
                       "primitive is wrapped once.")
    if not compat.wrap_lowering_rules(
        primitive, lambda rule: foreign.wrap_rule(rule, declaration)):
      raise ValueError(f"{owner}: the primitive has no lowering rule to wrap.")
    compat.wrap_abstract_eval(primitive, _explicit_batch_sharding(num_batch_dims,
                                                                  signature is not None))
    _wrapped[primitive] = declaration
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
  declaration = _declaration(owner, num_batch_dims, signature, shard_attributes)
  rule = jax.ffi.ffi_lowering(target_name, operand_layouts=operand_layouts,
                              result_layouts=result_layouts, **lowering_args)
  return foreign.wrap_rule(rule, declaration)
