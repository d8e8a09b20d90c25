"""Where a ``jax.ffi.ffi_call`` the decorator meets has its batch and reduced
dims, or why it stays plain: the placement half of the rewrite
(``decorator._Rewriter`` derives from ``CallPlaces``).

An operand's or result's place is ``(lead, rank)``: its batch dims are the
wrapper's last ``rank`` batch dims, starting at dim ``lead``; ``(0, 0)``: it
has none and is passed whole.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from batchpart import _compat as compat
from batchpart._frontend import batch_dims
from batchpart._vocab.batch_spec import fmt
from batchpart._vocab.dims.core import core_dims
from batchpart._vocab.dims.named_combiners import TOP_K_COMBINERS
from batchpart._vocab.dims.reduced import Reduction, check_results


def shape_of(var) -> tuple:
  """The shape of a jaxpr variable or literal (() for tokens and other non-arrays)."""
  return tuple(getattr(var.aval, "shape", ()))


def built_of_size(in_dims, shapes, size: int) -> int | None:
  """The first operand with a dim of ``size`` that the wrapper built (any dim
  of an operand the flow does not know), or None."""
  for k, (dims, shape) in enumerate(zip(in_dims, shapes)):
    labels = dims if dims is not None else (batch_dims.BUILT,) * len(shape)
    if any(n == size and d == batch_dims.BUILT for n, d in zip(shape, labels)):
      return k
  return None


def trailing_core_ranks(shapes, places) -> tuple:
  """Each array's core dims after its batch dims, from its ``(lead, rank)``."""
  return tuple(len(s) - lead - rank for s, (lead, rank) in zip(shapes, places))


class LeftPlain(Exception):
  """A ``jax.ffi.ffi_call`` stays plain: ``reason`` says why; ``unclear``
  where its batch dims cannot be told (the user is warned)."""

  def __init__(self, reason: str, unclear: bool = False):
    super().__init__(reason)
    self.reason, self.unclear = reason, unclear


def unless_unclear(place, *args):
  """``place(*args)``, or the ``LeftPlain`` it raises: whether the call stays
  plain for another reason is known only once every place is."""
  try:
    return place(*args)
  except LeftPlain as unclear:
    return unclear


class CallPlaces:
  """Placement of a call's operands and results in the wrapper's batch dims.
  Needs ``batch_shape``, ``leads`` (where a value the flow knows nothing of
  may hold the batch shape), ``reductions``, ``halos``, ``scans``, ``name``
  and ``_warn_unclear`` from the class it is mixed into."""

  batch_shape: tuple
  leads: list
  reductions: tuple
  halos: tuple
  scans: tuple
  name: str
  _warn_unclear: Callable[..., None]

  def _by_shape(self, shape, what):
    """``(lead, rank)`` of the batch shape in ``shape``, which the flow knows
    nothing of; ``(0, 0)`` where it is absent."""
    rank = len(self.batch_shape)
    fits = [p for p in self.leads if tuple(shape[p:p + rank]) == self.batch_shape]
    if len(fits) > 1:
      raise LeftPlain(
          f"the batch shape {fmt(self.batch_shape)} fits {what} (shape {fmt(shape)}) at "
          f"dim {fits[0]} and at dim {fits[1]}, and the flow of the wrapper's batch dims "
          f"does not say which", unclear=True)
    return (fits[0], rank) if fits else (0, 0)

  def _operand_place(self, dims, shape, what):
    """``(lead, rank)`` of an operand's batch dims: where the flow puts them,
    else by the shape; ``(0, 0)``: passed whole."""
    if dims is None:
      return self._by_shape(shape, what)
    place = batch_dims.block(dims, len(self.batch_shape))
    if place is None:
      raise LeftPlain(f"{what} (shape {fmt(shape)}) carries the wrapper's batch dims "
                       f"out of order or twice", unclear=True)
    return place

  def _result_place(self, want, shape, what):
    """``(lead, rank)`` of a result's batch dims: where its uses put the whole
    batch shape, else by the shape; ``(0, 0)``: no batch dims."""
    rank = len(self.batch_shape)
    place = None if want is None else batch_dims.block(want, rank)
    if place is not None and place[1] == rank and tuple(
        shape[place[0]:place[0] + rank]) == self.batch_shape:
      return place
    return self._by_shape(shape, what)

  def places(self, eqn, in_dims, wants):
    """Each operand's and result's ``(lead, rank)`` as a batchpart call;
    raises ``LeftPlain`` where the call stays a plain ``jax.ffi.ffi_call``."""
    params = eqn.params
    target, result_avals = params["target_name"], params["result_avals"]
    if params.get("custom_call_api_version", 4) != 4:
      raise LeftPlain(f"the call to {target!r} is not a typed FFI call "
                       f"(custom_call_api_version 4)")
    if any(r is compat.abstract_token for r in result_avals):
      raise LeftPlain(f"the call to {target!r} returns a token")
    if not self.batch_shape:
      raise LeftPlain("the batch shape is () (nothing to partition)")
    results = [unless_unclear(self._result_place, w, tuple(r.shape), f"result {i}")
               for i, (w, r) in enumerate(zip(wants, result_avals))]
    operands = [unless_unclear(self._operand_place, d, shape_of(v), f"operand {i}")
                for i, (d, v) in enumerate(zip(in_dims, eqn.invars))]
    # A call that would stay plain anyway needs no warning of unclear dims.
    if (0, 0) in results:
      shapes = ", ".join(str(tuple(r.shape)) for r in result_avals)
      raise LeftPlain(f"the call to {target!r} has results of shapes {shapes}, without "
                       f"the batch shape (a kernel called once per problem?)")
    if all(o == (0, 0) for o in operands):
      raise LeftPlain(f"the call to {target!r} has no batched operand (it runs whole)")
    for place in results + operands:
      if isinstance(place, LeftPlain):
        raise place
    for i, (d, v, place) in enumerate(zip(in_dims, eqn.invars, operands)):
      self._check_built(d, shape_of(v), place, f"operand {i}")
    return operands, results

  def _check_built(self, dims, shape, place, what):
    """Raises ``LeftPlain`` where an operand holds more of the batch shape
    than its ``(lead, rank)`` on dims the wrapper built (or the flow does not
    know): the kernel may read them as batch dims, which would then be cut
    on one operand and whole on this one, or as core dims; never a guess."""
    lead, rank = place
    full = len(self.batch_shape)
    labels = dims if dims is not None else (batch_dims.BUILT,) * len(shape)
    # Where the batch dims it lacks could sit: just before its own, or, with
    # none of its own, where the flow would look for the batch shape.
    spans = ([(lead - more, more) for more in range(1, full - rank + 1)] if rank else
             [(p, more) for p in self.leads for more in range(1, full + 1)])
    for start, more in spans:
      sizes = self.batch_shape[full - rank - more:full - rank]
      dims_there = labels[start:start + more] if start >= 0 else ()
      if (len(dims_there) == more and tuple(shape[start:start + more]) == sizes
          and math.prod(sizes) > 1 and all(d == batch_dims.BUILT for d in dims_there)):
        raise LeftPlain(
            f"{what} (shape {fmt(shape)}) is built inside the wrapper (an iota, a "
            f"constant, a closure or a broadcast) with dims {fmt(sizes)} at dim {start}, "
            f"the size of the wrapper's batch dims it does not carry; whether the kernel "
            f"reads them as batch dims (to be cut with the other operands) or whole "
            f"cannot be told. Pass it as an argument of the wrapper with its batch dims "
              f"in the signature to partition the call", unclear=True)

  def call_reductions(self, eqn, in_dims, operands, results, wants=()) -> tuple:
    """The wrapper's reduced dims this call reduces: those an operand carries
    (as the flow says). A result with a core dim of that size keeps the dim
    where its uses (``wants``, walked back from the wrapper's results that
    keep it) put the dim there and it has no other of that size; elsewhere
    the call might keep the dim (an elementwise kernel): nothing is declared
    there, with a warning, never a guess."""
    target = eqn.params["target_name"]
    result_avals = eqn.params["result_avals"]
    wants = list(wants) + [None] * (len(result_avals) - len(wants))
    out = []
    for r, dims, size in _carried(eqn, in_dims, operands, self.reductions):
      kept = _kept_dims(result_avals, results, wants, r.name, size)
      if isinstance(kept, int):
        self._warn_unclear(target, f"result {kept} has a core dim of the size of the "
                                   f"reduced dim {r.name!r} ({size}), so whether the "
                                   "kernel combines over it cannot be told; it is "
                                   "computed whole", partitioned=True)
        continue
      built = built_of_size(in_dims, [shape_of(v) for v in eqn.invars], size)
      if built is not None:
        self._warn_unclear(target, f"operand {built} is built inside the wrapper (an "
                                   f"iota, a constant, a closure or a broadcast) with a "
                                   f"dim of the size of the reduced dim {r.name!r} "
                                   f"({size}) that the flow cannot follow, so whether the "
                                   "kernel reads it along that dim cannot be told; it is "
                                   "computed whole", partitioned=True)
        continue
      k_dims = (_k_dims(eqn, operands, results, {i for i, _ in kept})
                if r.op in TOP_K_COMBINERS else ())
      if k_dims is None:
        self._warn_unclear(target, f"reduce {r.op!r} over {r.name!r}: the results do not "
                                   "each have one core dim of a size no operand's core "
                                   "dims have, so where they hold the k candidates cannot "
                                   "be told; it is computed whole", partitioned=True)
        continue
      out.append(Reduction(r.name, r.op, dims, kept, k_dims))
    if len({frozenset(i for i, _ in r.results) for r in out}) > 1:
      self._warn_unclear(target, f"its results keep some of the reduced dims "
                                 f"{', '.join(r.name for r in out)} but not all, which "
                                 "cannot be merged; they are computed whole",
                         partitioned=True)
      return ()
    check_results(f"batchpart.batch_partitionable({self.name}) (its call to '{target}')",
                  out, [a.shape for a in result_avals], [a.dtype for a in result_avals],
                  [(lead, len(a.shape) - lead - rank)
                   for a, (lead, rank) in zip(result_avals, results)])
    return tuple(out)

  def call_halos(self, eqn, in_dims, operands, results) -> tuple:
    """The wrapper's halo dims this call keeps: those an operand carries (as
    the flow says) where every result has exactly one core dim of that size
    (declared there, with the wrapper's window: the contract then holds for
    that kernel). Where a result has none or several, nothing is declared,
    with a warning, never a guess."""
    target = eqn.params["target_name"]
    out = []
    for h, dims, size in _carried(eqn, in_dims, operands, self.halos):
      result_dims = []
      for i, (a, (lead, rank)) in enumerate(zip(eqn.params["result_avals"], results)):
        fits = [j for j in _core_dims(a.shape, (lead, rank)) if a.shape[j] == size]
        if len(fits) != 1:
          self._warn_unclear(target, f"result {i} has {len(fits)} core dims of the size "
                                     f"of the halo dim {h.name!r} ({size}), so where the "
                                     "kernel keeps it cannot be told; it is computed "
                                     "whole", partitioned=True)
          break
        result_dims.append((i, _signed(fits[0], lead, len(a.shape))))
      else:
        out.append(dataclasses.replace(h, operand_dims=dims, result_dims=tuple(result_dims)))
    return tuple(out)


  def call_scans(self, eqn, in_dims, operands, results) -> tuple:
    """The wrapper's scanned dim as this call keeps it: where an operand
    carries it (as the flow says), each result has it at most once (one core
    dim of its size, or none: part of the summary), and the call's state is
    clear: its operand and result at the wrapper's state positions where
    they lack the dim and agree in shape and dtype, else the one such pair.
    Where any of that fails the dim is kept whole, with a warning, never a
    guess."""
    target = eqn.params["target_name"]
    out = []
    for t, dims, size in _carried(eqn, in_dims, operands, self.scans):
      avals = eqn.params["result_avals"]
      result_dims = []
      for i, (a, place) in enumerate(zip(avals, results)):
        fits = [j for j in _core_dims(a.shape, place) if a.shape[j] == size]
        if len(fits) > 1:
          self._warn_unclear(target, f"result {i} has {len(fits)} core dims of the size of "
                                     f"the scanned dim {t.name!r} ({size}), so where the "
                                     "kernel steps along it cannot be told; it is computed "
                                     "whole", partitioned=True)
          break
        if fits:
          result_dims.append((i, _signed(fits[0], place[0], len(a.shape))))
      else:
        state = _state_pair(eqn, {k for k, _ in dims}, {i for i, _ in result_dims}, t.state)
        if state is None or (not t.parallel and len(result_dims) + 1 != len(avals)):
          self._warn_unclear(target, f"which operand and result carry the state along the "
                                     f"scanned dim {t.name!r} cannot be told (or, without a "
                                     "merge, a result other than the state lacks the dim); "
                                     "it is computed whole", partitioned=True)
          continue
        out.append(dataclasses.replace(t, state=state, operand_dims=dims,
                                       result_dims=tuple(result_dims)))
    return tuple(out)


def _state_pair(eqn, stepped_operands, stepped_results, declared) -> tuple[int, int] | None:
  """The call's (state operand, state result): ``declared`` where both exist,
  lack the scanned dim and agree in shape and dtype; else the one operand
  and result that do; None where that is not one pair."""
  ins = [(k, shape_of(v), v.aval.dtype) for k, v in enumerate(eqn.invars)
         if k not in stepped_operands]
  outs = [(j, tuple(a.shape), a.dtype) for j, a in enumerate(eqn.params["result_avals"])
          if j not in stepped_results]
  pairs = [(k, j) for k, ks, kt in ins for j, js, jt in outs if ks == js and kt == jt]
  if tuple(declared) in pairs:
    return tuple(declared)
  return pairs[0] if len(pairs) == 1 else None


def _core_dims(shape, place) -> list[int]:
  """The dims of an array at ``(lead, rank)`` that are not batch dims."""
  lead, rank = place
  return core_dims(len(shape), lead, len(shape) - lead - rank)


def _kept_dims(result_avals, results, wants, name: str, size: int):
  """Where the call's results keep the reduced dim ``name`` (of ``size``), as
  (result, core axis) pairs: the one core dim of that size of a result whose
  uses put ``name`` there; the first result with a core dim of that size
  that is not so (an int) where any is."""
  kept = []
  for i, (a, place, want) in enumerate(zip(result_avals, results, wants)):
    fits = [j for j in _core_dims(a.shape, place) if a.shape[j] == size]
    if not fits:
      continue
    if want is None or len(fits) > 1 or batch_dims.reduced_at(want, name) != fits[0]:
      return i
    kept.append((i, _signed(fits[0], place[0], len(a.shape))))
  return tuple(kept)


def _k_dims(eqn, operands, results, kept=frozenset()):
  """Where each result of a top-k call but the ``kept`` ones holds its k
  candidates: its one core dim of a size no operand core dim has, as
  (result, core axis) pairs; None where a result has no such dim or
  several."""
  sizes = {shape_of(v)[j] for v, place in zip(eqn.invars, operands)
           for j in _core_dims(shape_of(v), place)}
  out = []
  for i, (a, place) in enumerate(zip(eqn.params["result_avals"], results)):
    if i in kept:
      continue
    fresh = [j for j in _core_dims(a.shape, place) if a.shape[j] not in sizes]
    if len(fresh) != 1:
      return None
    out.append((i, _signed(fresh[0], place[0], len(a.shape))))
  return tuple(out)


def _carried(eqn, in_dims, operands, declared):
  """The declared dims this call's operands carry (as the flow says), each
  with where it lies in them and its size (``_operand_places``)."""
  for dim in declared:
    placed = _operand_places(eqn, in_dims, operands, dim.name)
    if placed is not None:
      yield (dim, *placed)


def _operand_places(eqn, in_dims, operands, name: str):
  """Where the wrapper's core dim ``name`` lies in this call's operands, as
  the flow says: ((operand, axis), ...) with leading core axes >= 0 and
  trailing ones < 0, and the dim's size; None where no operand carries it."""
  where = [(k, at, lead) for k, (dims, (lead, _)) in enumerate(zip(in_dims, operands))
           if (at := batch_dims.reduced_at(dims, name)) is not None]
  if not where:
    return None
  size = shape_of(eqn.invars[where[0][0]])[where[0][1]]
  return tuple((k, _signed(at, lead, len(shape_of(eqn.invars[k]))))
               for k, at, lead in where), size


def _signed(at: int, lead: int, ndim: int) -> int:
  """Axis ``at`` of an array with ``lead`` leading core dims, as a core axis:
  itself where it leads, else counted from the end."""
  return at if at < lead else at - ndim
