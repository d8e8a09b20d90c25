"""``batchpart.batch_partitionable``: partition an existing ffi_call wrapper."""

from __future__ import annotations

import functools

import jax

from batchpart import _jax_adapter as adapter
from batchpart import _primitive
from batchpart._registry import mark_batch_partitionable
from batchpart._signature import (
    parse_signature, spec_from_num_batch_dims, spec_from_signature,
    broadcast_batch_shapes)


def batch_partitionable(fn=None, *, signature: str | None = None,
                        num_batch_dims: int | None = None):
  """Makes the ``jax.ffi.ffi_call``s inside an existing wrapper batch partitionable.

  The wrapper's positional array arguments follow ``signature`` (or
  ``num_batch_dims``) exactly as the operands of :func:`batchpart.ffi_call`
  do; its leading dims are the batch dims. Every ``jax.ffi.ffi_call`` traced
  inside the wrapper whose results carry that batch shape becomes a
  batch-partitionable call: an operand that carries the batch shape has it as
  batch dims, any other operand is passed whole to every shard. Its target
  is marked batch partitionable.

  Can be used as ``@batch_partitionable(signature=...)`` or
  ``batch_partitionable(fn, num_batch_dims=1)``.

  Args:
    fn: the wrapper to decorate.
    signature: a gufunc signature for the wrapper's positional arguments and
      results, e.g. ``"(n,n)->(n,n)"``.
    num_batch_dims: alternatively, the number of leading batch dims shared by
      all arguments and results.

  Returns:
    The decorated wrapper, with the same calling convention.
  """
  if fn is None:
    return functools.partial(batch_partitionable, signature=signature,
                             num_batch_dims=num_batch_dims)
  name = getattr(fn, "__name__", repr(fn))
  if not callable(fn):
    raise TypeError(f"batchpart.batch_partitionable: expected a function, got "
                    f"{type(fn).__name__} ({name}).")
  if (num_batch_dims is None) == (signature is None):
    raise ValueError(
        f"batchpart.batch_partitionable({name}): pass exactly one of "
        f"num_batch_dims and signature.")
  parsed = None if signature is None else parse_signature(signature, target_name=name)

  @functools.wraps(fn)
  def wrapper(*args, **kwargs):
    closed, out_shapes = jax.make_jaxpr(
        functools.partial(fn, **kwargs), return_shape=True)(*args)
    flat_args = jax.tree.leaves(args)
    batch_shape = _wrapper_batch_shape(name, parsed, num_batch_dims, flat_args,
                                       jax.tree.leaves(out_shapes))
    outs = _rewrite_eval(closed.jaxpr, closed.consts, flat_args, batch_shape)
    return jax.tree.unflatten(jax.tree.structure(out_shapes), outs)

  return wrapper


def _wrapper_batch_shape(name, parsed, num_batch_dims, args, outs):
  operand_shapes = [tuple(adapter.typeof(a).shape) for a in args]
  result_shapes = [tuple(o.shape) for o in outs]
  if parsed is None:
    spec = spec_from_num_batch_dims(name, num_batch_dims, operand_shapes, result_shapes)
  else:
    spec = spec_from_signature(name, parsed, operand_shapes, result_shapes)
  return broadcast_batch_shapes(name, [
      s[:len(s) - c] for s, c in zip(operand_shapes, spec.operand_core_ranks)])


def _core_ranks(shapes, batch_shape):
  """Core ranks for an inner call: arrays that carry the wrapper's batch
  shape have it as batch dims; others are passed whole (batch rank 0)."""
  rank = len(batch_shape)
  return tuple(len(s) - rank if tuple(s[:rank]) == tuple(batch_shape) else len(s)
               for s in shapes)


def _rebind_ffi_call(eqn, invals, batch_shape):
  params = eqn.params
  result_avals = params["result_avals"]
  if (params.get("custom_call_api_version", 4) < 4 or not batch_shape or
      any(r is adapter.abstract_token for r in result_avals) or
      any(tuple(r.shape[:len(batch_shape)]) != tuple(batch_shape) for r in result_avals)):
    return eqn.primitive.bind(*invals, **params)  # not batched: leave it alone
  mark_batch_partitionable(params["target_name"])
  return _primitive.bind(
      *invals,
      target_name=params["target_name"],
      result_avals=tuple(result_avals),
      operand_core_ranks=_core_ranks([v.aval.shape for v in eqn.invars], batch_shape),
      result_core_ranks=_core_ranks([r.shape for r in result_avals], batch_shape),
      has_side_effect=params["has_side_effect"],
      input_layouts=tuple(map(tuple, params["input_layouts"])),
      output_layouts=tuple(map(tuple, params["output_layouts"])),
      input_output_aliases=tuple(params["input_output_aliases"]),
      custom_call_api_version=params["custom_call_api_version"],
      legacy_backend_config=params["legacy_backend_config"],
      attributes=_primitive.typed_attributes(params["attributes"]),
  )


def _inline_jaxpr(eqn):
  """The closed jaxpr of a call-like eqn that can be inlined (jit, closed_call)."""
  for key in ("jaxpr", "call_jaxpr"):
    inner = eqn.params.get(key)
    if eqn.primitive.name in ("pjit", "jit", "closed_call", "core_call") and inner is not None:
      return inner if isinstance(inner, adapter.ClosedJaxpr) else adapter.ClosedJaxpr(inner, ())
  return None


def _rewrite_eval(jaxpr, consts, args, batch_shape):
  env = {}

  def read(v):
    return v.val if isinstance(v, adapter.Literal) else env[v]

  for var, val in zip(jaxpr.constvars, consts):
    env[var] = val
  for var, val in zip(jaxpr.invars, args):
    env[var] = val
  for eqn in jaxpr.eqns:
    invals = [read(v) for v in eqn.invars]
    inner = _inline_jaxpr(eqn)
    if eqn.primitive is adapter.jax_ffi_call_p:
      outs = _rebind_ffi_call(eqn, invals, batch_shape)
    elif inner is not None:
      outs = _rewrite_eval(inner.jaxpr, inner.consts, invals, batch_shape)
    else:
      outs = eqn.primitive.bind(*invals, **eqn.params)
    if not eqn.primitive.multiple_results and inner is None:
      outs = [outs]
    for var, val in zip(eqn.outvars, outs):
      env[var] = val
  return [read(v) for v in jaxpr.outvars]
