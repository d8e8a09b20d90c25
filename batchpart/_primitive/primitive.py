"""The ``batchpart_ffi_call`` primitive: one primitive for every target.

Its parameters carry, next to everything a typed ``jax.ffi.ffi_call``
carries, the number of core dims of each operand and result: trailing ones
and, where a signature's ``...`` puts the batch dims after some core dims,
leading ones; the dims between are batch dims. That description is invariant
under vmap (the new dim is one more batch dim, first among them), so the
batching rule is one call with a bigger batch.

Parameters: ``target_name``, ``result_avals``, ``operand_core_ranks``,
``result_core_ranks``, optionally ``operand_lead_ranks`` /
``result_lead_ranks`` (leading core dims; absent: none), ``has_side_effect``, ``input_layouts`` /
``output_layouts`` (minor-to-major), ``input_output_aliases`` (pairs),
``attributes`` (typed, hashable), optionally ``reductions`` / ``dim_names``
(reduced core dims and where named core dims are; absent: none),
``broadcast_batch`` (whether operands'
batch dims may broadcast, as under a signature, or must be equal, as under
``num_batch_dims``), optionally ``declaration`` (the declaration as written,
for ``batchpart.explain``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Set as AbstractSet
from typing import Any

from batchpart import _compat as compat
from batchpart._vocab.batch_spec import BatchSpec, check_spec, require_static_shapes
from batchpart._vocab.dims.core import absolute_dim
from batchpart._vocab.dims.halo import splits_into
from batchpart._vocab.dims.reduced import reduced_dims_table
from batchpart._vocab.dims.scan import as_halos


def _axes(entry) -> tuple:
  return () if entry is None else entry if isinstance(entry, tuple) else (entry,)


def _entry(axes: tuple):
  return None if not axes else axes[0] if len(axes) == 1 else axes


def _unreduced(spec) -> tuple:
  """The mesh axes a PartitionSpec holds partial sums over, sorted."""
  return tuple(sorted(getattr(spec, "unreduced", ())))


def _partitions(spec, rank: int) -> tuple:
  """A PartitionSpec's per-dim entries padded to ``rank`` (its unreduced and
  reduced axes, which tile no dim, left out)."""
  entries = tuple(getattr(spec, "partitions", spec))
  return entries + (None,) * (rank - len(entries))


def _check_reduced(owner: str, avals_in) -> None:
  """Refuses an operand whose Explicit-mode type holds partial sums: a
  kernel sees one device's addend, not the value, and jax does not reduce
  implicitly."""
  for i, aval in enumerate(avals_in):
    spec = getattr(getattr(aval, "sharding", None), "spec", None)
    axes = _unreduced(spec) if spec is not None else ()
    if axes:
      raise ValueError(
          f"{owner}: operand {i} is unreduced over mesh axes {axes} (its type "
          f"{aval.str_short()} holds per-device partial sums); reduce it first, e.g. "
          f"jax.sharding.reshard(x, PartitionSpec(...)) without unreduced axes.")


def _explicit_batch_entries(avals_in, operand_core_ranks, batch_shape,
                            operand_lead_ranks=(), reductions=(), halo_used=frozenset()):
  """Per batch dim, the mesh axes the results are typed with in Explicit
  mode: the operands' batch sharding, plus each axis that shards an
  operand's core dim moved onto the first batch dim it divides (whole axes:
  a type must be expressible on the mesh), as the partitioner moves the
  work. Axes on a reduced dim stay there: the results are combined over
  them and typed replicated, as ``jnp.sum`` over a sharded dim is.
  Returns (entries, mesh); mesh is None without Explicit operands."""
  table = reduced_dims_table(reductions, [len(a.shape) for a in avals_in])
  rank = len(batch_shape)
  entries: list[tuple] = [()] * rank
  used: set = set(halo_used)
  mesh = None
  specs = []
  leads = operand_lead_ranks or (0,) * len(operand_core_ranks)
  for k, (aval, c, lead) in enumerate(zip(avals_in, operand_core_ranks, leads)):
    sharding = getattr(aval, "sharding", None)
    spec = getattr(sharding, "spec", None)
    if spec is None or sharding.mesh.empty:
      continue
    mesh = sharding.mesh
    spec = _partitions(spec, len(aval.shape))
    if table:
      spec = tuple(None if r >= 0 else e for e, r in zip(spec, table[k]))
    specs.append((aval.shape, lead, len(aval.shape) - c - lead, spec))
  for shape, lead, b, spec in specs:   # batch dims first: they stay where they are
    for m in range(b):
      i = rank - b + m
      axes = _axes(spec[lead + m])
      if axes and not entries[i] and shape[lead + m] != 1 and not used & set(axes):
        entries[i] = axes
        used |= set(axes)
  for shape, lead, b, spec in specs:   # then core-dim axes, moved onto batch dims
    for j in [*range(lead), *range(lead + b, len(shape))]:
      axes = tuple(a for a in _axes(spec[j]) if a not in used)
      if not axes:
        continue
      size = 1
      for a in axes:
        size *= mesh.shape[a]
      for m in range(b):
        i = rank - b + m
        tiles = 1
        for a in entries[i]:
          tiles *= mesh.shape[a]
        if shape[lead + m] == batch_shape[i] and batch_shape[i] % (tiles * size) == 0:
          entries[i] = entries[i] + axes
          used |= set(axes)
          break
  return [_entry(e) for e in entries], mesh


def explicit_result_types(avals_in, result_avals, spec: BatchSpec, batch_shape
                          ) -> tuple | None:
  """``result_avals`` typed with the sharding the work lands on in Explicit
  mode (batch dims as _explicit_batch_entries, core dims whole); None where
  no operand's Explicit type shards the batch."""
  halo_axes = _explicit_halo_entries(avals_in, spec)
  used = frozenset(a for axes in halo_axes.values() for a in axes)
  entries, mesh = _explicit_batch_entries(avals_in, spec.operand_core_ranks, batch_shape,
                                          spec.operand_lead_ranks, spec.reductions, used)
  if mesh is None or (all(e is None for e in entries) and not halo_axes):
    return None
  from jax.sharding import NamedSharding, PartitionSpec
  kept = _kept_entries(avals_in, result_avals, spec.reductions, entries)
  out = []
  for k, (r, c, lead) in enumerate(zip(result_avals, spec.result_core_ranks,
                                       spec.result_leads)):
    parts = [None] * lead + list(entries) + [None] * c
    for dim, entry in kept.get(k, {}).items():
      parts[dim] = entry
    for h in (*spec.halos, *as_halos(spec.scans)):
      if h.name in halo_axes and k in dict(h.result_dims):
        parts[absolute_dim(dict(h.result_dims)[k], len(r.shape))] = _entry(halo_axes[h.name])
    out.append(r.update(sharding=NamedSharding(mesh, PartitionSpec(*parts))))
  return tuple(out)


def _kept_entries(avals_in, result_avals, reductions, entries) -> dict:
  """Per result that keeps a reduced dim, that dim's mesh axes (as the first
  operand with the dim has them, less any the batch took): the result stays
  split along it like the operands."""
  taken = {a for e in entries for a in _axes(e)}
  out: dict[int, dict[int, object]] = {}
  for r in reductions:
    k, axis = r.dims[0]
    sharding = getattr(avals_in[k], "sharding", None)
    spec = getattr(sharding, "spec", None)
    if spec is None or sharding is None or sharding.mesh.empty:
      continue
    rank = len(avals_in[k].shape)
    axes = tuple(a for a in _axes(_partitions(spec, rank)[absolute_dim(axis, rank)])
                 if a not in taken)
    for j, at in r.results:
      out.setdefault(j, {})[absolute_dim(at, len(result_avals[j].shape))] = _entry(axes)
  return out


def _explicit_halo_entries(avals_in, spec: BatchSpec) -> dict[str, tuple]:
  """Per halo dim the plan splits, the mesh axes of the first operand whose
  Explicit type shards it, as the partitioner keeps them: where the window
  can take the split, else the most major of them that it can take (the
  partitioner cuts a split too fine for the window into fewer parts)."""
  out: dict[str, tuple] = {}
  for h in (*spec.halos, *as_halos(spec.scans)):
    for k, axis in h.operand_dims:
      aval = avals_in[k]
      sharding = getattr(aval, "sharding", None)
      pspec = getattr(sharding, "spec", None)
      if pspec is None or sharding is None or sharding.mesh.empty:
        continue
      dim = absolute_dim(axis, len(aval.shape))
      axes = _axes(_partitions(pspec, len(aval.shape))[dim])
      taken = {a for v in out.values() for a in v}
      even = h.name in {s.name for s in spec.scans}
      kept = next((axes[:k] for k in range(len(axes), 0, -1) if splits_into(
          h, aval.shape[dim], math.prod(sharding.mesh.shape[a] for a in axes[:k]), even=even)),
          ())
      if kept and not taken & set(kept):
        out[h.name] = kept
      break
  return out


def result_types(avals_in, result_avals, spec: BatchSpec, batch_shape) -> tuple:
  """The result types of a batchpart call: explicit_result_types, else the
  context mesh's sharding."""
  typed = explicit_result_types(avals_in, result_avals, spec, batch_shape)
  if typed is not None:
    return typed
  return tuple(r.update(sharding=compat.get_cur_mesh_sharding()) for r in result_avals)


def reshard_core_to_batch(x, core_rank: int):
  """In Explicit mode, ``x`` resharded so its last ``core_rank`` dims are
  whole, each of their mesh axes moved onto the batch dims as the call's
  result types are (jax ops on matrices, e.g. a transpose, cannot mix the
  two); unchanged otherwise."""
  aval = compat.typeof(x)
  sharding = getattr(aval, "sharding", None)
  spec = getattr(sharding, "spec", None)
  if spec is None or sharding is None or sharding.mesh.empty or not sharding.mesh.explicit_axes:
    return x
  if _unreduced(spec):
    return x   # the call's abstract evaluation refuses it, naming the target
  spec = _partitions(spec, len(aval.shape))
  if all(e is None for e in spec[len(aval.shape) - core_rank:]):
    return x
  b = len(aval.shape) - core_rank
  entries, mesh = _explicit_batch_entries([aval], [core_rank], tuple(aval.shape[:b]))
  # A NamedSharding on the array's own mesh: a bare PartitionSpec needs a mesh
  # context, which an Explicit mesh does not require of jnp's own ops.
  from jax.sharding import NamedSharding, PartitionSpec, reshard
  return reshard(x, NamedSharding(mesh, PartitionSpec(*entries, *([None] * core_rank))))


def batch_primitive(name: str, owner: Callable[..., str],
                    effects: Callable[..., AbstractSet[Any]]) -> compat.Primitive:
  """A primitive over declared batch dims, as both batchpart primitives are:
  multiple results, eager through jit, an abstract evaluation that checks
  the call against the batch spec its parameters carry and types the results
  where the work lands, and no derivative of its own (like jax's callbacks).
  ``owner(**params)`` names a call in errors; ``effects(**params)`` are its
  effects."""
  primitive = compat.Primitive(name)
  primitive.multiple_results = True
  compat.simple_impl(primitive)

  def abstract_eval(*avals_in, result_avals, **params):
    who = owner(**params)
    operand_shapes = [a.shape for a in avals_in]
    result_shapes = [a.shape for a in result_avals]
    require_static_shapes(who, operand_shapes, result_shapes)
    spec = BatchSpec.from_params(params)
    batch_shape = check_spec(who, spec, operand_shapes, result_shapes)
    compat.standard_vma_rule(name, *avals_in)
    _check_reduced(who, avals_in)
    return result_types(avals_in, result_avals, spec, batch_shape), effects(**params)

  def not_differentiable(*args, **params):
    del args
    raise ValueError(
        f"{owner(**params)} cannot be differentiated: like jax.ffi.ffi_call and jax's "
        "callbacks, it has no derivative rule. Wrap the function that calls it in "
        "jax.custom_jvp or jax.custom_vjp to give it a derivative.")

  primitive.def_effectful_abstract_eval(abstract_eval)
  compat.primitive_jvps[primitive] = not_differentiable
  compat.primitive_transposes[primitive] = not_differentiable
  return primitive


def ffi_call_owner(target_name: str, **_) -> str:
  """How errors name an FFI call: as the entry point that makes one."""
  return f"batchpart.ffi_call('{target_name}')"


batchpart_ffi_call_p = batch_primitive(
    "batchpart_ffi_call", ffi_call_owner,
    lambda has_side_effect, **_: {compat.ffi_effect} if has_side_effect else compat.no_effects)


def typed_attributes(pairs) -> tuple:
  """jax's hashable (name, value) attribute pairs, each tagged with its
  value's type: params compare equal when 2 == 2.0, so without the tag a
  call with an int32 attribute and one with a float64 would share a cached
  executable."""
  return tuple((k, type(v).__name__, v) for k, v in pairs)


def bind(*args, **params):
  return batchpart_ffi_call_p.bind(*args, **params)
