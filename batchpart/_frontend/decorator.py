"""``batchpart.batch_partitionable``: partition an existing ffi_call wrapper.

The wrapper is traced to a jaxpr, and the jaxpr is evaluated again with every
batched ``jax.ffi.ffi_call`` replaced by a ``batchpart_ffi_call``: inside
nested jits, inside ``jax.custom_vjp`` / ``jax.custom_jvp`` rules (their
primal, forward and backward functions alike), so derivatives are
partitioned too, and inside ``custom_vmap`` bodies. A flow of the wrapper's
batch dims through the jaxpr (``batch_dims``) tells which dims of each
ffi_call's operands and results are batch dims; calls whose batch dims it
cannot tell, and calls the rewrite cannot reach, are warned about.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax

from batchpart import _compat as compat, _primitive
from batchpart._frontend import batch_dims
from batchpart._frontend.call_places import CallPlaces, LeftPlain, shape_of, trailing_core_ranks
from batchpart._frontend.rewrite_warnings import RewriteWarnings
from batchpart._frontend.signature import declared_spec, parse_declaration
from batchpart._partition import declared
from batchpart._vocab.batch_spec import broadcast_batch_shapes
from batchpart._vocab.dims.arguments import HaloSpec, ReduceSpec, ScanSpec
from batchpart._vocab.dims.batch import batch_slice
from batchpart._vocab.dims.core import absolute_dim


def batch_partitionable(fn: Callable[..., Any] | None = None, *, signature: str | None = None,
                        num_batch_dims: int | None = None,
                        reduce: ReduceSpec | None = None,
                        halo: HaloSpec | None = None,
                        scan: ScanSpec | None = None) -> Any:
  """Makes the ``jax.ffi.ffi_call`` calls inside an existing wrapper batch partitionable.

  The wrapper's positional array arguments follow ``signature`` (or
  ``num_batch_dims``) exactly as the operands of :func:`batchpart.ffi_call`
  do; its leading dims are the batch dims. Every typed ``jax.ffi.ffi_call``
  traced inside the wrapper whose results carry that batch shape becomes a
  batch-partitionable call. Which dims of its operands and results are batch
  dims follows the wrapper's batch dims through the computation: forward
  from the wrapper's arguments (through transposes, reshapes that keep them
  intact, broadcasts, elementwise ops, slices of core dims, nested jits and
  custom-derivative functions) and backward from its results. A value that
  carries no batch dim, such as one computed only from non-batched arguments
  and constants, is passed whole to every shard. A call with no batched
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
    reduce: ``{core dim name: op}`` (op ``"sum"``, ``"max"``, ``"min"`` or a
      combiner: ``"argmax"``, ``"argmin"``, ``"max_k"``, ``"min_k"``,
      ``"logsumexp"`` or a ``batchpart.Combiner``; as for
      :func:`batchpart.ffi_call`),
      with a signature: core dims of the wrapper's arguments that its
      results combine over (docs/reductions.md); a result that has
      the dim keeps it. The dim is followed through the wrapper like the
      batch dims; each ``jax.ffi.ffi_call`` that takes it is declared reduced
      over it (the contract then holds for that kernel), its results that
      the flow walks back from a wrapper's result keeping the dim keeping it
      too. A call with another result that has a dim of that size is left
      with the dim whole, with a warning.
    halo: ``{core dim name: w or batchpart.Halo(lo, hi, periodic=False, ends=None, cval=0.0)}``,
      with a signature: core dims of the wrapper's arguments and every
      result along which it is local (docs/halos.md). The dim is followed
      through the wrapper like a reduced dim; each ``jax.ffi.ffi_call`` that
      takes it and whose every result has exactly one core dim of its size is
      declared with that halo (the contract then holds for that kernel).
    scan: ``{core dim name: batchpart.Scan(state=(k, j), ...)}``, with a
      signature: the wrapper carries a state along the dim from its argument
      ``k`` to its result ``j`` (docs/scans.md). The dim is followed through
      the wrapper like a halo dim; each ``jax.ffi.ffi_call`` that takes it,
      whose results have it at most once each, and whose state is clear (its
      operand ``k`` and result ``j`` where they lack the dim and agree in
      shape and dtype, else the one operand and result that do) is declared
      with that scan (the contract then holds for that kernel; a merge then
      composes that call's summaries). Elsewhere the dim is kept whole, with a
      warning.

  Where the flow cannot tell (a primitive it does not know), a value has
  batch dims where the batch shape appears in its shape: at the position of a
  ``...`` in the signature, else in front. Where that fits at more than one
  position (a core dim the size of the batch), or the flow finds the batch
  dims out of order, the call stays a plain ``jax.ffi.ffi_call`` (computed
  whole on every device) and a ``UserWarning`` names the wrapper
  (``__qualname__``) and the call's target: never a guess.

  Returns:
    The decorated wrapper, with the same calling convention.
  """
  if fn is None:
    return functools.partial(batch_partitionable, signature=signature,
                             num_batch_dims=num_batch_dims, reduce=reduce, halo=halo,
                             scan=scan)
  name = getattr(fn, "__name__", repr(fn))
  qualname = getattr(fn, "__qualname__", name)
  if not callable(fn):
    raise TypeError(f"batchpart.batch_partitionable: expected a function, got "
                    f"{type(fn).__name__} ({name}).")
  owner = f"batchpart.batch_partitionable({name})"
  parsed, reductions, halos, scans = parse_declaration(owner, num_batch_dims, signature,
                                                       reduce, halo=halo, scan=scan)

  @functools.wraps(fn)
  def wrapper(*args, **kwargs):
    closed, out_shapes = jax.make_jaxpr(
        functools.partial(fn, **kwargs), return_shape=True)(*args)
    flat_args = jax.tree.leaves(args)
    batch_shape, in_dims, out_dims, leads = _wrapper_spec(
        name, parsed, num_batch_dims, flat_args, jax.tree.leaves(out_shapes), reductions,
        halos, scans)
    rewriter = _Rewriter(name, qualname, batch_shape, leads, reductions, halos, scans)
    outs, _ = rewriter.eval(closed.jaxpr, closed.consts, flat_args, in_dims, out_dims)
    rewriter.finish_trace()
    return jax.tree.unflatten(jax.tree.structure(out_shapes), outs)

  return wrapper


def _wrapper_spec(name, parsed, num_batch_dims, args, outs, reductions=(), halos=(),
                  scans=()):
  """The wrapper's broadcast batch shape, the batch dims of its arguments
  (with their reduced dims' names) and results, and the positions (leading
  core dims) of the signature's ``...``s."""
  operand_shapes = [tuple(compat.typeof(a).shape) for a in args]
  result_shapes = [tuple(o.shape) for o in outs]
  owner = f"batchpart.batch_partitionable({name})"
  spec = declared_spec(owner, parsed, num_batch_dims, operand_shapes, result_shapes,
                       reductions, halos, scans)
  batch_shape = broadcast_batch_shapes(owner, [
      batch_slice(s, lead, c)
      for s, c, lead in zip(operand_shapes, spec.operand_core_ranks, spec.operand_leads)])

  def dims(shapes, cores, leads):
    """The batch dims of arrays of these shapes, core ranks and leads."""
    return [batch_dims.of_array(len(s), lead, c, len(batch_shape))
            for s, c, lead in zip(shapes, cores, leads)]

  reduced = {}   # argument -> {dim: reduced, halo or scanned dim name}
  for name_, pairs in [*((r.name, r.dims) for r in reductions),
                       *((h.name, h.operand_dims) for h in (*halos, *scans))]:
    for k, axis in pairs:
      reduced.setdefault(k, {})[absolute_dim(axis, len(operand_shapes[k]))] = name_
  # The results that keep a reduced dim name it, so the flow walks it back
  # to the calls that keep it.
  kept = {}
  for r in reductions:
    for k, axis in r.results:
      kept.setdefault(k, {})[absolute_dim(axis, len(result_shapes[k]))] = r.name
  in_dims = dims(operand_shapes, spec.operand_core_ranks, spec.operand_leads)
  out_dims = dims(result_shapes, spec.result_core_ranks, spec.result_leads)
  return (batch_shape,
          [batch_dims.with_reduced(d, reduced.get(k, {})) for k, d in enumerate(in_dims)],
          [batch_dims.with_reduced(d, kept.get(k, {})) for k, d in enumerate(out_dims)],
          (*spec.operand_lead_ranks, *spec.result_lead_ranks))


def _count_ffi_calls(jaxprs) -> int:
  """How many ``jax.ffi.ffi_call``s the jaxprs contain, at any depth."""
  count = 0
  for jaxpr in jaxprs:
    for eqn in jaxpr.eqns:
      count += eqn.primitive is compat.jax_ffi_call_p
      count += _count_ffi_calls(compat.jaxprs_in_eqn(eqn))
  return count


class _Rewriter(RewriteWarnings, CallPlaces):
  """Evaluates jaxprs with batched ffi_calls rebound as batchpart calls.

  Alongside the values it runs the flow of batch dims (``batch_dims``): which
  dims of each value carry the wrapper's batch dims, forward from the
  wrapper's arguments and backward from its results. An ffi_call's operands
  and results have their batch dims where the flow puts them; where it
  cannot tell, where the batch shape appears in the shape (at a ``...``
  position of the signature, else in front), and if it appears at more than
  one the call stays plain, with a warning.
  """

  def __init__(self, name, qualname, batch_shape, leads=(), reductions=(), halos=(),
               scans=()):
    super().__init__(name, qualname, tuple(batch_shape))
    self.reductions = tuple(reductions)
    self.halos = tuple(halos)
    self.scans = tuple(scans)
    # Where a value the flow knows nothing of may hold the batch shape: at
    # the signature's '...' positions, else in front.
    self.leads = [*dict.fromkeys(int(p) for p in leads if p), 0]

  def _rebind_ffi_call(self, eqn, invals, in_dims, wants):
    """A ``jax.ffi.ffi_call`` eqn bound again, as a batchpart call where its
    batch dims are known, else unchanged: its results and their batch dims."""
    params = eqn.params
    try:
      operands, results = self.places(eqn, in_dims, wants)
    except LeftPlain as plain:
      if plain.unclear:
        self._warn_unclear(params["target_name"], plain.reason)
      else:
        self.left_alone.append(plain.reason)
      # XLA's default for a plain call is right.
      outs = compat.bind_eqn(eqn, invals)
      return outs, batch_dims.forward(eqn, in_dims)
    self.rewritten += 1
    declared.declare(params["target_name"])
    result_avals = tuple(params["result_avals"])
    result_shapes = [tuple(r.shape) for r in result_avals]
    reductions = self.call_reductions(eqn, in_dims, operands, results, wants)
    leads = {"reductions": reductions} if reductions else {}
    halos = self.call_halos(eqn, in_dims, operands, results)
    if halos:
      leads["halos"] = halos
    scans = self.call_scans(eqn, in_dims, operands, results)
    if scans:
      leads["scans"] = scans
    if any(lead for lead, _ in operands + results):
      leads.update(operand_lead_ranks=tuple(lead for lead, _ in operands),
                   result_lead_ranks=tuple(lead for lead, _ in results))
    outs = _primitive.bind(
        *invals,
        target_name=params["target_name"],
        result_avals=result_avals,
        operand_core_ranks=trailing_core_ranks(map(shape_of, eqn.invars), operands),
        result_core_ranks=trailing_core_ranks(result_shapes, results),
        **leads,
        has_side_effect=params["has_side_effect"],
        input_layouts=tuple(map(tuple, params["input_layouts"])),
        output_layouts=tuple(map(tuple, params["output_layouts"])),
        input_output_aliases=tuple(params["input_output_aliases"]),
        attributes=_primitive.typed_attributes(params["attributes"]),
        broadcast_batch=True,
    )
    rank = len(self.batch_shape)
    dims = [batch_dims.of_array(len(s), lead, len(s) - lead - rank, rank)
            for s, (lead, _) in zip(result_shapes, results)]
    # The results carry the halo, scanned and kept reduced dims on, for the
    # calls that take them next.
    carried = [*((h.name, h.result_dims) for h in (*halos, *scans)),
               *((r.name, r.results) for r in reductions)]
    return outs, [batch_dims.with_reduced(d, {absolute_dim(a, len(d)): name
                                              for name, pairs in carried
                                              for k2, a in pairs if k2 == k})
                  for k, d in enumerate(dims)]

  def closed(self, closed, in_dims, out_dims=()):
    """A closed jaxpr with the same signature, its ffi_calls rewritten;
    ``in_dims`` / ``out_dims`` are its inputs' and outputs' batch dims as far
    as known (None: unknown)."""
    return self._closed(closed, in_dims, out_dims)[0]

  def _closed(self, closed, in_dims, out_dims):
    """``closed`` rewritten, and its outputs' batch dims."""
    avals = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in closed.in_avals]
    found = []

    def run(*args):
      outs, dims = self.eval(closed.jaxpr, closed.consts, args, in_dims, out_dims)
      found[:] = dims
      return outs

    rewritten = jax.make_jaxpr(run)(*avals)
    self._report_deferred()
    return rewritten, found

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

  def _eval_eqn(self, eqn, invals, in_dims, wants):
    """One eqn evaluated with its calls rewritten: its results (a list) and
    their batch dims; ``wants`` are where the results' uses put them."""
    if eqn.primitive is compat.jax_ffi_call_p:
      outs, dims = self._rebind_ffi_call(eqn, invals, in_dims, wants)
    elif (inner := compat.inlinable_jaxpr(eqn)) is not None:
      return self.eval(inner.jaxpr, inner.consts, invals, in_dims, wants)
    elif compat.is_custom_derivative_call(eqn):
      call, dims = self._closed(compat.called_jaxpr(eqn), in_dims, wants)
      outs = compat.bind_custom_derivative_call(eqn, invals, call, in_dims, wants,
                                                self.closed, self.function)
    elif compat.is_custom_vmap_call(eqn):
      call, dims = self._closed(compat.called_jaxpr(eqn), in_dims, wants)
      outs = compat.bind_custom_vmap_call(eqn, invals, call, self._unpartitioned_vmap_rule)
    else:
      hidden = _count_ffi_calls(compat.jaxprs_in_eqn(eqn))
      if hidden:
        self.hidden[eqn.primitive.name] = self.hidden.get(eqn.primitive.name, 0) + hidden
      outs, dims = compat.bind_eqn(eqn, invals), batch_dims.forward(eqn, in_dims)
    return (outs if eqn.primitive.multiple_results else [outs]), dims

  def eval(self, jaxpr, consts, args, in_dims, out_dims=()):
    """Evaluates ``jaxpr`` with its calls rewritten; ``in_dims`` are its
    inputs' batch dims and ``out_dims`` where its outputs' uses put them (None
    or missing: unknown). Returns the outputs and their batch dims."""
    wants = batch_dims.demands(jaxpr, out_dims)
    env = dict(zip(jaxpr.constvars, consts))
    env.update(zip(jaxpr.invars, args))
    known = {v: batch_dims.built(len(shape_of(v))) for v in jaxpr.constvars}
    known.update(zip(jaxpr.invars, in_dims))

    def read(v):
      return v.val if isinstance(v, compat.Literal) else env[v]

    def dims(v):
      # A literal or a scalar carries no batch dim.
      if isinstance(v, compat.Literal) or not shape_of(v):
        return batch_dims.shared(len(shape_of(v)))
      return known.get(v)

    for eqn in jaxpr.eqns:
      with compat.eqn_context(eqn):
        outs, out_dims = self._eval_eqn(eqn, [read(v) for v in eqn.invars],
                                        [dims(v) for v in eqn.invars],
                                        [wants.get(v) for v in eqn.outvars])
      env.update(zip(eqn.outvars, outs))
      known.update(zip(eqn.outvars, out_dims))
    return [read(v) for v in jaxpr.outvars], [dims(v) for v in jaxpr.outvars]
