"""``batchpart.batch_partitionable``: partition an existing ffi_call wrapper.

The wrapper is traced to a jaxpr, and the jaxpr is evaluated again with every
batched ``jax.ffi.ffi_call`` replaced by a ``batchpart_ffi_call``: inside
nested jits, and inside ``jax.custom_vjp`` / ``jax.custom_jvp`` rules (their
primal, forward and backward functions alike), so derivatives are
partitioned too.
"""

from __future__ import annotations

import functools

import jax

from batchpart import _compat as compat, _primitive
from batchpart._frontend.registry import note_called
from batchpart._frontend.signature import (
  broadcast_batch_shapes,
  parse_signature,
  spec_from_num_batch_dims,
  spec_from_signature,
)


def batch_partitionable(fn=None, *, signature: str | None = None,
                        num_batch_dims: int | None = None):
  """Makes the ``jax.ffi.ffi_call``s inside an existing wrapper batch partitionable.

  The wrapper's positional array arguments follow ``signature`` (or
  ``num_batch_dims``) exactly as the operands of :func:`batchpart.ffi_call`
  do; its leading dims are the batch dims. Every typed ``jax.ffi.ffi_call``
  traced inside the wrapper whose results carry that batch shape becomes a
  batch-partitionable call. Its operands that are the wrapper's own
  arguments have the batch dims the signature gives them; any other operand
  has them if its leading dims equal the batch shape, and is otherwise passed
  whole to every shard. Calls inside ``jax.custom_vjp`` / ``jax.custom_jvp``
  functions (the JAX FFI tutorial's pattern) are rewritten too, including
  their forward and backward rules.

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
    batch_shape, core_ranks = _wrapper_spec(name, parsed, num_batch_dims, flat_args,
                                            jax.tree.leaves(out_shapes))
    known = dict(zip(closed.jaxpr.invars, core_ranks))
    outs = _Rewriter(batch_shape).eval(closed.jaxpr, closed.consts, flat_args, known)
    return jax.tree.unflatten(jax.tree.structure(out_shapes), outs)

  return wrapper


def _wrapper_spec(name, parsed, num_batch_dims, args, outs):
  """The wrapper's broadcast batch shape and its arguments' core ranks."""
  operand_shapes = [tuple(compat.typeof(a).shape) for a in args]
  result_shapes = [tuple(o.shape) for o in outs]
  if parsed is None:
    spec = spec_from_num_batch_dims(name, num_batch_dims, operand_shapes, result_shapes)
  else:
    spec = spec_from_signature(name, parsed, operand_shapes, result_shapes)
  batch_shape = broadcast_batch_shapes(name, [
      s[:len(s) - c] for s, c in zip(operand_shapes, spec.operand_core_ranks)])
  return batch_shape, spec.operand_core_ranks


class _Rewriter:
  """Evaluates jaxprs with batched ffi_calls rebound as batchpart calls."""

  def __init__(self, batch_shape):
    self.batch_shape = tuple(batch_shape)

  def _core_rank(self, shape, known_core_rank):
    if known_core_rank is not None:
      return known_core_rank
    rank = len(self.batch_shape)
    return len(shape) - rank if tuple(shape[:rank]) == self.batch_shape else len(shape)

  def _rebind_ffi_call(self, eqn, invals, known):
    params = eqn.params
    result_avals = params["result_avals"]
    rank = len(self.batch_shape)
    if (params.get("custom_call_api_version", 4) != 4 or not self.batch_shape or
        any(r is compat.abstract_token for r in result_avals) or
        any(tuple(r.shape[:rank]) != self.batch_shape for r in result_avals)):
      return compat.bind_eqn(eqn, invals)  # not batched: leave it alone
    note_called(params["target_name"])
    return _primitive.bind(
        *invals,
        target_name=params["target_name"],
        result_avals=tuple(result_avals),
        operand_core_ranks=tuple(
            self._core_rank(v.aval.shape, known.get(v) if not isinstance(
                v, compat.Literal) else None) for v in eqn.invars),
        result_core_ranks=tuple(self._core_rank(r.shape, None) for r in result_avals),
        has_side_effect=params["has_side_effect"],
        input_layouts=tuple(map(tuple, params["input_layouts"])),
        output_layouts=tuple(map(tuple, params["output_layouts"])),
        input_output_aliases=tuple(params["input_output_aliases"]),
        attributes=_primitive.typed_attributes(params["attributes"]),
        broadcast_batch=True,
        attribute_rule="",
    )

  def closed(self, closed):
    """A closed jaxpr with the same signature, its ffi_calls rewritten."""
    avals = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in closed.in_avals]
    return jax.make_jaxpr(
        lambda *a: self.eval(closed.jaxpr, closed.consts, a, {}))(*avals)

  def function(self, f):
    """``f`` (a function of arrays returning a pytree of arrays), with the
    ffi_calls it makes rewritten."""
    def rewritten(*args):
      try:
        inner, shapes = jax.make_jaxpr(f, return_shape=True)(*args)
      except TypeError:
        return f(*args)  # returns symbolic zeros: nothing to trace into
      outs = self.eval(inner.jaxpr, inner.consts, args, {})
      return jax.tree.unflatten(jax.tree.structure(shapes), outs)
    return rewritten

  def eval(self, jaxpr, consts, args, known):
    env = {}

    def read(v):
      return v.val if isinstance(v, compat.Literal) else env[v]

    for var, val in zip(jaxpr.constvars, consts):
      env[var] = val
    for var, val in zip(jaxpr.invars, args):
      env[var] = val
    for eqn in jaxpr.eqns:
      invals = [read(v) for v in eqn.invars]
      inner = compat.inlinable_jaxpr(eqn)
      if eqn.primitive is compat.jax_ffi_call_p:
        outs = self._rebind_ffi_call(eqn, invals, known)
      elif inner is not None:
        inner_known = {iv: known[ov] for iv, ov in zip(inner.jaxpr.invars, eqn.invars)
                       if not isinstance(ov, compat.Literal) and ov in known}
        outs = self.eval(inner.jaxpr, inner.consts, invals, inner_known)
      elif compat.is_custom_derivative_call(eqn):
        outs = compat.bind_custom_derivative_call(eqn, invals, self.closed, self.function)
      else:
        outs = compat.bind_eqn(eqn, invals)
      if not eqn.primitive.multiple_results and inner is None:
        outs = [outs]
      for var, val in zip(eqn.outvars, outs):
        env[var] = val
    return [read(v) for v in jaxpr.outvars]
