"""The ``batchpart_ffi_call`` primitive: one primitive for every target.

Its parameters carry, next to everything ``jax.ffi.ffi_call`` carries, the
number of core dims of each operand and result; all leading dims are batch
dims. That description is invariant under vmap (a new leading dim is one
more batch dim), so the batching rule is one call with a bigger batch.
"""

from __future__ import annotations

from batchpart import _jax_adapter as adapter
from batchpart import _partitioner
from batchpart._signature import check_spec, BatchSpec

batchpart_ffi_call_p = adapter.Primitive("batchpart_ffi_call")
batchpart_ffi_call_p.multiple_results = True
adapter.simple_impl(batchpart_ffi_call_p)


def _batch_ranks(shapes, core_ranks) -> tuple[int, ...]:
  return tuple(len(s) - c for s, c in zip(shapes, core_ranks))


# ---------------------------------------------------------------------------
# Abstract evaluation
# ---------------------------------------------------------------------------

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
    return lambda core_rank: adapter.get_cur_mesh_sharding()
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
  check_spec(target_name, BatchSpec(operand_core_ranks, result_core_ranks),
             [a.shape for a in avals_in], [a.shape for a in result_avals])
  adapter.standard_vma_rule("batchpart_ffi_call", *avals_in)
  batch_rank = max((len(a.shape) - c for a, c in zip(avals_in, operand_core_ranks)),
                   default=0)
  effects = {adapter.ffi_effect} if has_side_effect else adapter.no_effects
  sharding = _result_sharder(avals_in, operand_core_ranks, batch_rank)
  return tuple(r.update(sharding=sharding(c))
               for r, c in zip(result_avals, result_core_ranks)), effects


batchpart_ffi_call_p.def_effectful_abstract_eval(_abstract_eval)


# ---------------------------------------------------------------------------
# Lowering
# ---------------------------------------------------------------------------

def _sharding_rule(operand_shapes, operand_core_ranks, result_shapes,
                   result_core_ranks, batch_shape) -> tuple[str, tuple[str, ...]]:
  """Shardy rule: batch dims share one factor per batch dim; core dims (and
  broadcast size-1 batch dims) get factors of their own that need
  replication, so Shardy never pushes a sharding onto them."""
  rank = len(batch_shape)
  replicated: list[str] = []

  def mapping(prefix: str, k: int, shape, core_rank: int) -> str:
    b = len(shape) - core_rank
    names = []
    for m in range(b):
      i = rank - b + m
      if shape[m] == batch_shape[i]:
        names.append(f"b{i}")
      else:
        names.append(f"{prefix}{k}_{m}")
        replicated.append(names[-1])
    for j in range(core_rank):
      names.append(f"{prefix}{k}_{b + j}")
      replicated.append(names[-1])
    return " ".join(names)

  lhs = ", ".join(mapping("o", k, s, c) for k, (s, c) in
                  enumerate(zip(operand_shapes, operand_core_ranks)))
  rhs = ", ".join(mapping("r", k, s, c) for k, (s, c) in
                  enumerate(zip(result_shapes, result_core_ranks)))
  return f"{lhs} -> {rhs}", tuple(replicated)


def _lowering(ctx, *operands, target_name, result_avals, operand_core_ranks,
              result_core_ranks, has_side_effect, input_layouts, output_layouts,
              input_output_aliases, custom_call_api_version, legacy_backend_config,
              attributes):
  del result_avals  # ctx.avals_out are the (possibly vmapped) results
  avals_in, avals_out = ctx.avals_in, ctx.avals_out
  operand_shapes = [a.shape for a in avals_in]
  result_shapes = [a.shape for a in avals_out]
  batch_shape = check_spec(target_name, BatchSpec(operand_core_ranks, result_core_ranks),
                           operand_shapes, result_shapes)
  attrs = adapter.unwrap_kwargs_hashable(tuple((k, v) for k, _, v in attributes))
  if custom_call_api_version >= 4:
    backend_config = adapter.attribute_dict(attrs)
  else:
    backend_config = legacy_backend_config or ""

  operand_batch_ranks = _batch_ranks(operand_shapes, operand_core_ranks)
  result_batch_ranks = _batch_ranks(result_shapes, result_core_ranks)
  extra = {"mhlo.frontend_attributes": adapter.frontend_attributes({
      "num_batch_dims": str(len(batch_shape)),
      # Lets a process that only sees the module (jax.export) rebuild the
      # call record: see _partitioner.record_module.
      _partitioner.BATCH_RANKS_ATTRIBUTE: _partitioner.format_batch_ranks(
          operand_batch_ranks, result_batch_ranks),
  })}
  if adapter.use_shardy() and avals_in and not adapter.is_manual_lowering(ctx):
    rule, replicated = _sharding_rule(operand_shapes, operand_core_ranks,
                                      result_shapes, result_core_ranks, batch_shape)
    extra["sdy.sharding_rule"] = adapter.sdy_sharding_rule(
        rule, adapter.ir_types(ctx, avals_in), adapter.ir_types(ctx, avals_out),
        replicated)

  _partitioner.record_call(
      target_name,
      [(a.shape, a.dtype) for a in avals_in],
      [(a.shape, a.dtype) for a in avals_out],
      adapter.backend_config_text(backend_config),
      _partitioner.CallRecord(
          operand_batch_ranks=operand_batch_ranks,
          result_batch_ranks=result_batch_ranks,
          operand_layouts=tuple(map(tuple, input_layouts)),
          result_layouts=tuple(map(tuple, output_layouts)),
          aliases=tuple(input_output_aliases),
          has_side_effect=has_side_effect,
          api_version=custom_call_api_version,
      ))
  return adapter.emit_custom_call(
      target_name, operands,
      result_types=adapter.ir_types(ctx, avals_out),
      backend_config=backend_config,
      api_version=custom_call_api_version,
      has_side_effect=has_side_effect,
      operand_layouts=input_layouts,
      result_layouts=output_layouts,
      aliases=input_output_aliases,
      extra_attributes=extra,
  )


adapter.register_lowering(batchpart_ffi_call_p, _lowering)


# ---------------------------------------------------------------------------
# vmap: the mapped axis becomes one more leading batch dim
# ---------------------------------------------------------------------------

def _shift_layout(layout, new_dims: int = 1):
  """Minor-to-major layout of an array that gained `new_dims` leading (most
  major) dims."""
  return tuple(n + new_dims for n in layout) + tuple(range(new_dims - 1, -1, -1))


def _batching_rule(args, dims, *, result_avals, input_layouts, output_layouts,
                   input_output_aliases, **params):
  from jax import lax

  size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
  core_ranks = params["operand_core_ranks"]
  unmapped_batch_ranks = [len(a.shape) - c - (d is not None)
                          for a, c, d in zip(args, core_ranks, dims)]
  rank = max(unmapped_batch_ranks, default=0)
  args = [a if d is None else adapter.moveaxis(a, d, 0) for a, d in zip(args, dims)]
  dims = list(dims)
  # An aliased operand must have its result's shape: materialise the new dim.
  for i, _ in input_output_aliases:
    if dims[i] is None:
      args[i] = lax.broadcast(args[i], (size,))
      dims[i] = 0
  input_layouts = list(input_layouts)
  for i, (a, d, b) in enumerate(zip(args, dims, unmapped_batch_ranks)):
    if d is None:
      continue  # a missing leading dim: broadcast, right-aligned
    # The mapped dim must line up with the new leading batch dim, so an
    # operand with fewer batch dims gets size-1 (broadcast) dims after it.
    pad = rank - b
    if pad:
      args[i] = lax.expand_dims(a, tuple(range(1, pad + 1)))
    input_layouts[i] = _shift_layout(input_layouts[i], pad + 1)
  input_layouts = tuple(input_layouts)
  output_layouts = tuple(_shift_layout(l) for l in output_layouts)
  result_avals = tuple(r.update(shape=(size, *r.shape)) for r in result_avals)
  outs = batchpart_ffi_call_p.bind(
      *args, result_avals=result_avals, input_layouts=input_layouts,
      output_layouts=output_layouts, input_output_aliases=input_output_aliases,
      **params)
  return outs, [0] * len(outs)


adapter.primitive_batchers[batchpart_ffi_call_p] = _batching_rule


def _not_differentiable(*args, target_name, **_):
  del args
  raise ValueError(
      f"The FFI call to '{target_name}' cannot be differentiated. Wrap the "
      "function that calls batchpart.ffi_call in jax.custom_jvp or "
      "jax.custom_vjp to give it a derivative.")


adapter.primitive_jvps[batchpart_ffi_call_p] = _not_differentiable
adapter.primitive_transposes[batchpart_ffi_call_p] = _not_differentiable


def typed_attributes(pairs) -> tuple:
  """jax's hashable (name, value) attribute pairs, each tagged with its
  value's type: params compare equal when 2 == 2.0, so without the tag a
  call with an int32 attribute and one with a float64 would share a cached
  executable (and the second would fail the first's way, or the reverse)."""
  return tuple((k, type(v).__name__, v) for k, v in pairs)


def bind(*args, **params):
  return batchpart_ffi_call_p.bind(*args, **params)

