"""``batchpart.batch_partitionable``: partition an existing ffi_call wrapper.

The wrapper is traced to a jaxpr, and the jaxpr is evaluated again with every
batched ``jax.ffi.ffi_call`` replaced by a ``batchpart_ffi_call``: inside
nested jits, inside ``jax.custom_vjp`` / ``jax.custom_jvp`` rules (their
primal, forward and backward functions alike), so derivatives are
partitioned too, and inside ``custom_vmap`` bodies. A forward dataflow tells
which operands are shared (computed from non-batched arguments and constants
only) and so passed whole; calls the rewrite cannot reach are warned about.
"""

from __future__ import annotations

import functools
import warnings

import jax

from batchpart import _compat as compat, _primitive
from batchpart._frontend.signature import (
  parse_signature,
  spec_from_num_batch_dims,
  spec_from_signature,
)
from batchpart._partition import declared
from batchpart._primitive.batch_spec import batch_slice, broadcast_batch_shapes


def batch_partitionable(fn=None, *, signature: str | None = None,
                        num_batch_dims: int | None = None):
  """Makes the ``jax.ffi.ffi_call``s inside an existing wrapper batch partitionable.

  The wrapper's positional array arguments follow ``signature`` (or
  ``num_batch_dims``) exactly as the operands of :func:`batchpart.ffi_call`
  do; its leading dims are the batch dims. Every typed ``jax.ffi.ffi_call``
  traced inside the wrapper whose results carry that batch shape becomes a
  batch-partitionable call. Its operands that are the wrapper's own
  arguments have the batch dims the signature gives them, values computed
  only from non-batched arguments and constants are shared (passed whole to
  every shard), and any other operand has batch dims if its leading dims
  equal the batch shape and is otherwise passed whole. A call with no batched
  operand stays a plain ``jax.ffi.ffi_call``. Calls inside ``jax.custom_vjp``
  / ``jax.custom_jvp`` functions (the JAX FFI tutorial's pattern) are
  rewritten too, including their forward and backward rules, and so are
  ``jax.custom_batching.custom_vmap`` bodies. A ``UserWarning`` naming the
  wrapper says when no call was partitioned, or when calls sit inside
  primitives the rewrite does not enter (``lax.scan``, ``while_loop``,
  ``cond``, ...).

  Can be used as ``@batch_partitionable(signature=...)`` or
  ``batch_partitionable(fn, num_batch_dims=1)``.

  Args:
    fn: the wrapper to decorate.
    signature: a gufunc signature for the wrapper's positional arguments and
      results, e.g. ``"(n,n)->(n,n)"``.
    num_batch_dims: alternatively, the number of leading batch dims shared by
      all arguments and results.

  With a ``...`` in the signature (batch dims after some core dims, e.g.
  ``"(a,...,n)->(...,n)"``), the wrapper's arguments have their batch dims
  where it stands; a value inside the wrapper that is neither an argument nor
  shared is batched where the batch shape appears in it, at the position of a
  ``...`` in the signature or else in front.

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
  parsed = None if signature is None else parse_signature(
      signature, owner=f"batchpart.batch_partitionable({name})")

  @functools.wraps(fn)
  def wrapper(*args, **kwargs):
    closed, out_shapes = jax.make_jaxpr(
        functools.partial(fn, **kwargs), return_shape=True)(*args)
    flat_args = jax.tree.leaves(args)
    batch_shape, core_ranks, leads = _wrapper_spec(name, parsed, num_batch_dims,
                                                   flat_args, jax.tree.leaves(out_shapes))
    rewriter = _Rewriter(name, batch_shape, leads)
    outs, _ = rewriter.eval(closed.jaxpr, closed.consts, flat_args, core_ranks)
    rewriter.finish_trace()
    return jax.tree.unflatten(jax.tree.structure(out_shapes), outs)

  return wrapper


def _wrapper_spec(name, parsed, num_batch_dims, args, outs):
  """The wrapper's broadcast batch shape, its arguments' core ranks and the
  positions (leading core dims) of the signature's ``...``s."""
  operand_shapes = [tuple(compat.typeof(a).shape) for a in args]
  result_shapes = [tuple(o.shape) for o in outs]
  owner = f"batchpart.batch_partitionable({name})"
  if parsed is None:
    spec = spec_from_num_batch_dims(owner, num_batch_dims, operand_shapes, result_shapes)
  else:
    spec = spec_from_signature(owner, parsed, operand_shapes, result_shapes)
  batch_shape = broadcast_batch_shapes(owner, [
      batch_slice(s, lead, c)
      for s, c, lead in zip(operand_shapes, spec.operand_core_ranks, spec.operand_leads)])
  core_ranks = tuple(_CoreRank.of(c, lead)
                     for c, lead in zip(spec.operand_core_ranks, spec.operand_leads))
  return batch_shape, core_ranks, (*spec.operand_lead_ranks, *spec.result_lead_ranks)


class _CoreRank(int):
  """A known core rank (the trailing core dims) that also says how many core
  dims lead (``lead``, before the batch dims); plain ints lead with none."""
  lead: int = 0

  @classmethod
  def of(cls, core_rank: int, lead: int):
    if not lead:
      return int(core_rank)
    out = cls(core_rank)
    out.lead = int(lead)
    return out


def _lead(core_rank) -> int:
  return getattr(core_rank, "lead", 0)


def _ndim(var) -> int:
  """The rank of a jaxpr variable or literal (0 for tokens and other non-arrays)."""
  return len(getattr(var.aval, "shape", ()))


def _all_shared(vars_, ranks) -> bool:
  """Whether every value is shared: its known core rank is its whole rank."""
  return all(r is not None and r == _ndim(v) for v, r in zip(vars_, ranks))


def _shared_if_inputs_are(eqn, in_ranks):
  """The core ranks the dataflow gives an eqn's results: a result computed only
  from shared values is shared (all core dims); otherwise the shape rule decides."""
  if _all_shared(eqn.invars, in_ranks):
    return [_ndim(v) for v in eqn.outvars]
  return [None] * len(eqn.outvars)


def _count_ffi_calls(jaxprs) -> int:
  """How many ``jax.ffi.ffi_call``s the jaxprs contain, at any depth."""
  count = 0
  for jaxpr in jaxprs:
    for eqn in jaxpr.eqns:
      count += eqn.primitive is compat.jax_ffi_call_p
      count += _count_ffi_calls(compat.jaxprs_in_eqn(eqn))
  return count


class _Rewriter:
  """Evaluates jaxprs with batched ffi_calls rebound as batchpart calls.

  Alongside the values it runs a forward dataflow over core ranks: a value
  with a known core rank is either one of the wrapper's arguments (the batch
  spec gives its rank) or *shared*, computed only from shared arguments and
  constants (its core rank is its whole rank, so it is passed whole to every
  shard). Any other value falls back to the shape rule: batched if its leading
  dims equal the batch shape.
  """

  def __init__(self, name, batch_shape, leads=()):
    self.name = name
    self.batch_shape = tuple(batch_shape)
    # Where a value of unknown origin may hold the batch shape: at the
    # signature's '...' positions, else in front.
    self.leads = [*dict.fromkeys(int(p) for p in leads if p), 0]
    self.rewritten = 0
    self.left_alone = []   # why calls stayed plain jax.ffi.ffi_calls
    self.hidden = {}       # primitive name -> ffi_calls inside it, not entered
    self.tracing = True
    self.warned = False

  def _core_rank(self, shape, known_core_rank):
    """A value's core rank: the known one, else by the shape rule."""
    if known_core_rank is not None:
      return known_core_rank
    rank = len(self.batch_shape)
    for lead in self.leads:
      if tuple(shape[lead:lead + rank]) == self.batch_shape:
        return _CoreRank.of(len(shape) - lead - rank, lead)
    return len(shape)

  def _result_core_ranks(self, result_avals) -> tuple:
    return tuple(self._core_rank(r.shape, None) for r in result_avals)

  def _why_not_batched(self, params, operand_core_ranks, operand_shapes):
    """Why a ``jax.ffi.ffi_call`` cannot become a batchpart call, or None."""
    target, result_avals = params["target_name"], params["result_avals"]
    if params.get("custom_call_api_version", 4) != 4:
      return f"the call to {target!r} is not a typed FFI call (custom_call_api_version 4)"
    if any(r is compat.abstract_token for r in result_avals):
      return f"the call to {target!r} returns a token"
    if not self.batch_shape:
      return "the batch shape is () (nothing to partition)"
    if any(_lead(c) + c == len(r.shape)
           for c, r in zip(self._result_core_ranks(result_avals), result_avals)):
      shapes = ", ".join(str(tuple(r.shape)) for r in result_avals)
      return (f"the call to {target!r} has results of shapes {shapes}, without the batch "
              f"shape (a kernel called once per problem?)")
    if all(_lead(c) + c == len(s) for c, s in zip(operand_core_ranks, operand_shapes)):
      return f"the call to {target!r} has no batched operand (it runs whole)"
    return None

  def _rebind_ffi_call(self, eqn, invals, in_ranks):
    """A ``jax.ffi.ffi_call`` eqn bound again: as a batchpart call where it is
    batched, else unchanged."""
    params = eqn.params
    shapes = [tuple(getattr(v.aval, "shape", ())) for v in eqn.invars]
    core_ranks = tuple(self._core_rank(s, r) for s, r in zip(shapes, in_ranks))
    why_not = self._why_not_batched(params, core_ranks, shapes)
    if why_not is not None:
      # Nothing to partition by: XLA's default for a plain call is right.
      self.left_alone.append(why_not)
      return compat.bind_eqn(eqn, invals)
    self.rewritten += 1
    declared.declare(params["target_name"])
    result_avals = tuple(params["result_avals"])
    result_core_ranks = self._result_core_ranks(result_avals)
    leads = {}
    if any(map(_lead, core_ranks + result_core_ranks)):
      leads = {"operand_lead_ranks": tuple(map(_lead, core_ranks)),
               "result_lead_ranks": tuple(map(_lead, result_core_ranks))}
    return _primitive.bind(
        *invals,
        target_name=params["target_name"],
        result_avals=result_avals,
        operand_core_ranks=tuple(map(int, core_ranks)),
        result_core_ranks=tuple(map(int, result_core_ranks)),
        **leads,
        has_side_effect=params["has_side_effect"],
        input_layouts=tuple(map(tuple, params["input_layouts"])),
        output_layouts=tuple(map(tuple, params["output_layouts"])),
        input_output_aliases=tuple(params["input_output_aliases"]),
        attributes=_primitive.typed_attributes(params["attributes"]),
        broadcast_batch=True,
    )

  def closed(self, closed, in_ranks):
    """A closed jaxpr with the same signature, its ffi_calls rewritten;
    ``in_ranks`` are its inputs' known core ranks (None: unknown)."""
    avals = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in closed.in_avals]
    rewritten = jax.make_jaxpr(
        lambda *a: self.eval(closed.jaxpr, closed.consts, a, in_ranks)[0])(*avals)
    self._report_deferred()
    return rewritten

  def function(self, f):
    """``f`` (a function of arrays returning a pytree of arrays), with the
    ffi_calls it makes rewritten."""
    def rewritten(*args):
      try:
        inner, shapes = jax.make_jaxpr(f, return_shape=True)(*args)
      except TypeError:
        return f(*args)  # returns symbolic zeros: nothing to trace into
      # Nothing is known of a backward rule's residuals and cotangents.
      outs, _ = self.eval(inner.jaxpr, inner.consts, args, [None] * len(args))
      self._report_deferred()
      return jax.tree.unflatten(jax.tree.structure(shapes), outs)
    return rewritten

  def _eval_eqn(self, eqn, invals, in_ranks):
    """One eqn evaluated with its calls rewritten: its results (a list) and
    their known core ranks."""
    if eqn.primitive is compat.jax_ffi_call_p:
      outs = self._rebind_ffi_call(eqn, invals, in_ranks)
      outs = outs if eqn.primitive.multiple_results else [outs]
      return outs, _shared_if_inputs_are(eqn, in_ranks)
    inner = compat.inlinable_jaxpr(eqn)
    if inner is not None:
      return self.eval(inner.jaxpr, inner.consts, invals, in_ranks)
    if compat.is_custom_derivative_call(eqn):
      outs = compat.bind_custom_derivative_call(eqn, invals, in_ranks, self.closed,
                                                self.function)
    elif compat.is_custom_vmap_call(eqn):
      outs = compat.bind_custom_vmap_call(eqn, invals, in_ranks, self.closed,
                                          self._unpartitioned_vmap_rule)
    else:
      hidden = _count_ffi_calls(compat.jaxprs_in_eqn(eqn))
      if hidden:
        self.hidden[eqn.primitive.name] = self.hidden.get(eqn.primitive.name, 0) + hidden
      outs = compat.bind_eqn(eqn, invals)
    outs = outs if eqn.primitive.multiple_results else [outs]
    return outs, _shared_if_inputs_are(eqn, in_ranks)

  def eval(self, jaxpr, consts, args, in_ranks):
    """Evaluates ``jaxpr`` with its calls rewritten; ``in_ranks`` are the known
    core ranks of its inputs. Returns the outputs and their known core ranks."""
    env = {}
    known = {v: _ndim(v) for v in jaxpr.constvars}   # constants are shared
    known.update((v, r) for v, r in zip(jaxpr.invars, in_ranks) if r is not None)

    def read(v):
      return v.val if isinstance(v, compat.Literal) else env[v]

    def rank(v):
      return _ndim(v) if isinstance(v, compat.Literal) else known.get(v)

    env.update(zip(jaxpr.constvars, consts))
    env.update(zip(jaxpr.invars, args))
    for eqn in jaxpr.eqns:
      outs, out_ranks = self._eval_eqn(eqn, [read(v) for v in eqn.invars],
                                       [rank(v) for v in eqn.invars])
      for var, val, r in zip(eqn.outvars, outs, out_ranks):
        env[var] = val
        if r is not None:
          known[var] = r
    return [read(v) for v in jaxpr.outvars], [rank(v) for v in jaxpr.outvars]

  def _unpartitioned_vmap_rule(self, rule):
    """``rule`` (a custom_vmap rule), warning that its calls are not rewritten."""
    def warned_rule(*args):
      self._warn(f"under jax.vmap, a jax.custom_batching.custom_vmap function inside "
                 f"it runs its own vmap rule ({getattr(rule, '__name__', rule)}), "
                 f"whose jax.ffi.ffi_calls the decorator does not rewrite")
      return rule(*args)
    return warned_rule

  def _hidden_message(self):
    return "; ".join(
        f"{n} jax.ffi.ffi_call(s) inside {prim!r}, which it does not enter, stay "
        f"unpartitioned" for prim, n in sorted(self.hidden.items()))

  def _warn(self, message):
    """Warns once per trace of the wrapper."""
    if not self.warned:
      self.warned = True
      warnings.warn(f"batchpart.batch_partitionable({self.name}): {message}.",
                    UserWarning, stacklevel=4)

  def _report_deferred(self):
    """After a rule traced after the wrapper (forward, JVP, backward): warns
    of calls it could not reach."""
    if not self.tracing and self.hidden:
      self._warn(self._hidden_message())

  def finish_trace(self):
    """At the end of the wrapper's trace: warns where calls stay unpartitioned."""
    self.tracing = False
    if self.rewritten == 0:
      reasons = list(dict.fromkeys(self.left_alone))[:3]
      if self.hidden:
        reasons.append(self._hidden_message())
      detail = "; ".join(reasons) or "it calls no jax.ffi.ffi_call"
      self._warn(f"found no jax.ffi.ffi_call with the batch shape {self.batch_shape} "
                 f"to partition; {detail}")
    elif self.hidden:
      self._warn(self._hidden_message())
