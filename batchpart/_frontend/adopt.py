"""Adopting batchpart without rewriting a package's calls:
``partition_primitive`` for an existing primitive, ``partition_ffi_target``
for a package's plain ``jax.ffi.ffi_call``s, ``unpartition`` to undo either,
``ffi_lowering`` for package authors."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax.extend.core import Primitive

from batchpart._frontend import declarations
from batchpart._frontend.signature import batch_rank, parse_declaration
from batchpart._partition import attributes
from batchpart._primitive import foreign
from batchpart._vocab.dims.arguments import HaloSpec, ReduceSpec, ScanSpec


def _declaration(owner: str, num_batch_dims: int | None, signature: str | None,
                 shard_attributes: Callable[..., Any] | None,
                 reduce: ReduceSpec | None = None,
                 halo: HaloSpec | None = None,
                 scan: ScanSpec | None = None) -> foreign.BatchDeclaration:
  """The checked declaration of a ``partition_primitive`` / ``ffi_lowering``
  call (``owner`` names it in errors)."""
  parsed, reductions, halos, scans = parse_declaration(owner, num_batch_dims, signature,
                                                       reduce, halo=halo, scan=scan)
  if num_batch_dims is not None and not callable(num_batch_dims):
    num_batch_dims = batch_rank(owner, num_batch_dims)
  if shard_attributes is not None and not callable(shard_attributes):
    raise TypeError(f"{owner}: shard_attributes must be None or a callable "
                    "(attributes, batch_shape) -> dict, got "
                    f"{type(shard_attributes).__name__}.")
  rule = (None if shard_attributes is None else
          attributes.make_rule(shard_attributes, owner=owner))
  core_ranks = None if parsed is None else parsed.spec(
      reductions, named=rule is not None and rule.takes_core_sizes, halos=halos, scans=scans)
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


def partition_primitive(primitive: Primitive, *, num_batch_dims: int | None = None,
                        signature: str | None = None,
                        shard_attributes: Callable[..., Any] | None = None,
                        reduce: ReduceSpec | None = None,
                        halo: HaloSpec | None = None,
                        scan: ScanSpec | None = None) -> Primitive:
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
    signature: alternatively, a gufunc signature of the emitted custom call
      (a ``...`` in a group puts that array's batch dims there instead of in
      front, e.g. ``"(a,...,n)->(...)"``).
    reduce: ``{core dim name: op}`` (op ``"sum"``, ``"max"``, ``"min"`` or a
      combiner: ``"argmax"``, ``"argmin"``, ``"max_k"``, ``"min_k"``,
      ``"logsumexp"`` or a ``batchpart.Combiner``),
      with a signature: dims every result combines over, as for
      :func:`batchpart.ffi_call` (docs/reductions.md).
    halo: ``{core dim name: w or batchpart.Halo(lo, hi, periodic=False, ends=None, cval=0.0)}``,
      with a signature: dims along which the call is local, as for
      :func:`batchpart.ffi_call` (docs/halos.md).
    shard_attributes: None, or a callable ``(attributes, batch_shape) ->
      dict`` called for each per-device call with the FFI attributes (NumPy
      scalars/arrays, strings) and that device's local batch shape; the
      entries it returns replace those attributes in the per-device call
      (e.g. a batch size passed as an attribute). A rule that takes a third
      argument gets ``core_sizes``, the local size of each named core dim of
      the signature (e.g. the number of points of a reduced dim). A rule is
      identified by
      what it computes: a digest of its code, defaults, captured values and
      the globals it reads. A changed rule (a fix, another closure of one
      factory) gives new derived target names, so neither batchpart's
      partition cache nor jax's persistent compilation cache can serve a
      program partitioned with the old one. A rule that captures a value
      batchpart cannot digest raises ``TypeError``; give it a string
      ``__batchpart_key__`` attribute that changes whenever it does.

  Returns:
    ``primitive`` itself. The same declaration again does nothing; another
    one raises ``ValueError`` naming the primitive (``batchpart.unpartition``
    it first). What changes: every program lowered from now on, including a
    ``jax.jit`` function compiled before (its next call traces and compiles
    again, as the declarations in force are part of jax's cache keys; jax's
    caches are not cleared). Compiled objects
    (``jax.jit(f).lower(...).compile()``) never change.

  In Explicit sharding mode the primitive's results are typed as
  :func:`batchpart.ffi_call` types those of the declared call.
  """
  owner = f"batchpart.partition_primitive({getattr(primitive, 'name', primitive)!r})"
  if not hasattr(primitive, "bind") or not hasattr(primitive, "name"):
    raise TypeError(f"batchpart.partition_primitive: expected a JAX primitive, got "
                    f"{type(primitive).__name__}.")
  declaration = _declaration(owner, num_batch_dims, signature, shard_attributes, reduce, halo,
                             scan)
  declarations.declare_primitive(primitive, declaration, _same_declaration)
  return primitive


def partition_ffi_target(target_name: str, *, num_batch_dims: int | None = None,
                         signature: str | None = None,
                         shard_attributes: Callable[..., Any] | None = None,
                         reduce: ReduceSpec | None = None,
                         halo: HaloSpec | None = None,
                         scan: ScanSpec | None = None) -> None:
  """Makes every ``jax.ffi.ffi_call`` to ``target_name`` batch partitionable.

  From now on every ``jax.ffi.ffi_call`` to ``target_name`` lowered in this
  process — by any package, inside ``jax.custom_batching.custom_vmap``,
  ``custom_vjp``, ``jit`` or ``vmap`` — is partitioned as declared, exactly
  like a :func:`batchpart.ffi_call`; calls to other targets are untouched
  (they compile to the same program as without batchpart). For packages that
  call ``jax.ffi.ffi_call`` directly and have no primitive of their own.

  Args:
    target_name: the FFI target, as the package passes it to
      ``jax.ffi.ffi_call``.
    num_batch_dims, signature, shard_attributes, reduce: as for
      :func:`batchpart.partition_primitive`, describing the custom call as
      emitted (its shapes are what ``bp.explain`` of the stock program shows).

  Returns:
    None. The declaration is in force, process-wide, from this call on.

  Raises:
    TypeError: if ``target_name`` is not a non-empty string, or
      ``shard_attributes`` is neither None nor a callable (or captures a
      value batchpart cannot digest, as for
      :func:`batchpart.partition_primitive`).
    ValueError: for a bad declaration, or another declaration already in
      force for the target (``batchpart.unpartition`` it first); and, when a
      call to the target is lowered, if it does not fit the declaration (the
      message names ``partition_ffi_target``, the target and the operand).

  What changes, and what does not: as for
  :func:`batchpart.partition_primitive`.
  """
  if not isinstance(target_name, str) or not target_name:
    raise TypeError(f"batchpart.partition_ffi_target: target_name must be a non-empty "
                    f"str, got {target_name!r}.")
  owner = f"batchpart.partition_ffi_target('{target_name}')"
  declaration = _declaration(owner, num_batch_dims, signature, shard_attributes, reduce, halo,
                             scan)
  declarations.declare_target(target_name, declaration, _same_declaration)


def unpartition(primitive_or_target_name: Primitive | str | Callable[..., Any]) -> None:
  """Restores the stock lowering of a primitive (``partition_primitive``), of
  the ``jax.ffi.ffi_call`` calls to a target (``partition_ffi_target``), or of the
  jax callbacks of a function (``partition_callback``).

  Programs lowered from now on are lowered as without batchpart (a
  ``jax.jit`` function traces and compiles again on its next call, as after
  every change of the declarations in force). Declaring again afterwards
  works.

  Args:
    primitive_or_target_name: what was declared: the primitive given to
      :func:`batchpart.partition_primitive`, the target name given to
      :func:`batchpart.partition_ffi_target`, or the function given to
      :func:`batchpart.partition_callback`.

  Raises:
    ValueError: naming it, if it is not partitioned by batchpart.
  """
  declarations.withdraw(primitive_or_target_name)


def ffi_lowering(target_name: str, *, num_batch_dims: int | None = None,
                 signature: str | None = None,
                 shard_attributes: Callable[..., Any] | None = None,
                 reduce: ReduceSpec | None = None,
                 halo: HaloSpec | None = None,
                 scan: ScanSpec | None = None,
                 operand_layouts: Sequence[Sequence[int] | None] | None = None,
                 result_layouts: Sequence[Sequence[int] | None] | None = None,
                 **lowering_args: Any) -> Callable[..., Any]:
  """A drop-in for :func:`jax.ffi.ffi_lowering` whose custom call is batch
  partitionable.

  Takes ``jax.ffi.ffi_lowering``'s arguments plus exactly one of
  ``num_batch_dims`` and ``signature``, an optional ``shard_attributes`` and
  an optional ``reduce``, as :func:`batchpart.partition_primitive` does.
  Register the returned rule
  with ``jax.interpreters.mlir.register_lowering`` as usual.

  Args:
    target_name: the FFI target the rule's custom call calls.
    num_batch_dims: the number of leading batch dims of every operand and
      result of the emitted call: an int, or a callable
      ``(operand_shapes, result_shapes) -> int``.
    signature: alternatively, a gufunc signature of the emitted call.
    shard_attributes: None, or a per-device attribute rule, as for
      :func:`batchpart.partition_primitive`.
    reduce: ``{core dim name: op}``, with a signature, as for
      :func:`batchpart.ffi_call`.
    operand_layouts: as for :func:`jax.ffi.ffi_lowering`.
    result_layouts: as for :func:`jax.ffi.ffi_lowering`.
    **lowering_args: every other argument of :func:`jax.ffi.ffi_lowering`
      (``backend_config``, ...), passed on.

  Returns:
    A lowering rule, ``(ctx, *operands, **params) -> results``, that emits
    the call as ``jax.ffi.ffi_lowering``'s rule does, batch partitionable
    where XLA partitions it.

  Raises:
    TypeError: if ``shard_attributes`` is neither None nor a callable.
    ValueError: for a bad declaration (both or neither of
      ``num_batch_dims`` and ``signature``, a bad signature or ``reduce``);
      and, when a call is lowered, if it does not fit the declaration
      (naming the target and the operand).
  """
  owner = f"batchpart.ffi_lowering('{target_name}')"
  declaration = _declaration(owner, num_batch_dims, signature, shard_attributes, reduce, halo,
                             scan)
  rule = jax.ffi.ffi_lowering(target_name, operand_layouts=operand_layouts,
                              result_layouts=result_layouts, **lowering_args)
  return foreign.wrap_rule(rule, lambda params: declaration)
