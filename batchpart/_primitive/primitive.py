"""The ``batchpart_ffi_call`` primitive: one primitive for every target.

Its parameters carry, next to everything a typed ``jax.ffi.ffi_call``
carries, the number of core dims of each operand and result; all leading dims
are batch dims. That description is invariant under vmap (a new leading dim is
one more batch dim), so the batching rule is one call with a bigger batch.

Parameters: ``target_name``, ``result_avals``, ``operand_core_ranks``,
``result_core_ranks``, ``has_side_effect``, ``input_layouts`` /
``output_layouts`` (minor-to-major), ``input_output_aliases`` (pairs),
``attributes`` (typed, hashable), ``broadcast_batch`` (whether operands'
batch dims may broadcast, as under a signature, or must be equal, as under
``num_batch_dims``) and ``attribute_rule`` (a per-shard attribute rule's
name, or "").
"""

from __future__ import annotations

from batchpart import _compat as compat
from batchpart._frontend.signature import BatchSpec, check_spec, require_static_shapes

batchpart_ffi_call_p = compat.Primitive("batchpart_ffi_call")
batchpart_ffi_call_p.multiple_results = True
compat.simple_impl(batchpart_ffi_call_p)


def _batch_spec_entries(avals_in, operand_core_ranks, batch_rank: int):
  """Per batch dim, the mesh axes the operands' types shard it over (Explicit
  mode); None where no operand shards it."""
  entries = [None] * batch_rank
  mesh = None
  for aval, c in zip(avals_in, operand_core_ranks):
    sharding = getattr(aval, "sharding", None)
    spec = getattr(sharding, "spec", None)
    if spec is None or sharding.mesh.empty:
      continue
    b = len(aval.shape) - c
    for m in range(b):
      i = batch_rank - b + m
      entry = spec[m] if m < len(spec) else None
      if entry is not None and entries[i] is None and aval.shape[m] != 1:
        entries[i] = entry
        mesh = sharding.mesh
  return entries, mesh


def _result_sharder(avals_in, operand_core_ranks, batch_rank: int):
  """A function of a result's core rank giving its sharding: the operands'
  batch sharding (Explicit mode), core dims unsharded."""
  entries, mesh = _batch_spec_entries(avals_in, operand_core_ranks, batch_rank)
  if mesh is None or all(e is None for e in entries):
    return lambda core_rank: compat.get_cur_mesh_sharding()
  used = set()
  for i, e in enumerate(entries):  # a mesh axis may shard one dim only
    axes = e if isinstance(e, tuple) else (e,)
    if e is not None and used & set(axes):
      entries[i] = None
    elif e is not None:
      used |= set(axes)
  from jax.sharding import NamedSharding, PartitionSpec
  return lambda core_rank: NamedSharding(
      mesh, PartitionSpec(*entries, *([None] * core_rank)))


def _abstract_eval(*avals_in, target_name, result_avals, operand_core_ranks,
                   result_core_ranks, has_side_effect, **_):
  require_static_shapes(target_name, [a.shape for a in avals_in],
                        [a.shape for a in result_avals])
  check_spec(target_name, BatchSpec(operand_core_ranks, result_core_ranks),
             [a.shape for a in avals_in], [a.shape for a in result_avals])
  compat.standard_vma_rule("batchpart_ffi_call", *avals_in)
  batch_rank = max((len(a.shape) - c for a, c in zip(avals_in, operand_core_ranks)),
                   default=0)
  effects = {compat.ffi_effect} if has_side_effect else compat.no_effects
  sharding = _result_sharder(avals_in, operand_core_ranks, batch_rank)
  return tuple(r.update(sharding=sharding(c))
               for r, c in zip(result_avals, result_core_ranks)), effects


batchpart_ffi_call_p.def_effectful_abstract_eval(_abstract_eval)


def _not_differentiable(*args, target_name, **_):
  del args
  raise ValueError(
      f"The FFI call to '{target_name}' cannot be differentiated. Wrap the "
      "function that calls batchpart.ffi_call in jax.custom_jvp or "
      "jax.custom_vjp to give it a derivative.")


compat.primitive_jvps[batchpart_ffi_call_p] = _not_differentiable
compat.primitive_transposes[batchpart_ffi_call_p] = _not_differentiable


def typed_attributes(pairs) -> tuple:
  """jax's hashable (name, value) attribute pairs, each tagged with its
  value's type: params compare equal when 2 == 2.0, so without the tag a
  call with an int32 attribute and one with a float64 would share a cached
  executable."""
  return tuple((k, type(v).__name__, v) for k, v in pairs)


def bind(*args, **params):
  return batchpart_ffi_call_p.bind(*args, **params)
