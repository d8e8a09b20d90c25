"""Lowering ``batchpart_ffi_call``: a custom call under the derived name that
carries its description, with a ``num_batch_dims`` frontend attribute and,
under Shardy, a sharding rule."""

from __future__ import annotations

from batchpart import _compat as compat
from batchpart._frontend.registry import note_called
from batchpart._frontend.signature import BatchSpec, check_spec
from batchpart._partition import emit, targets
from batchpart._partition.description import CallDescription
from batchpart._primitive.primitive import batchpart_ffi_call_p


def sharding_rule(operand_shapes, operand_core_ranks, result_shapes, result_core_ranks,
                  batch_shape) -> tuple[str, tuple[str, ...]]:
  """Shardy rule: one factor per batch dim, shared by every operand and
  result that has it. A result's core dim shares the factor of the same core
  dim at the same core position of the first operand with that size there
  (its input's layout, as for an elementwise op), so a core-sharded input
  gives a result sharded the same way instead of a replicated one;
  batchpart's partitioner still runs the kernel on batch shards. Every
  other core dim, and every broadcast size-1 batch dim, is a factor of its
  own that needs replication, so Shardy never pushes a sharding onto it."""
  rank = len(batch_shape)
  replicated: list[str] = []
  operand_cores: list[tuple[list[str], tuple[int, ...]]] = []

  def batch_names(prefix, k, shape, core_rank):
    b = len(shape) - core_rank
    names = []
    for m in range(b):
      if shape[m] == batch_shape[rank - b + m]:
        names.append(f"b{rank - b + m}")
      else:
        names.append(f"{prefix}{k}_{m}")
        replicated.append(names[-1])
    return names, b

  def operand(k, shape, core_rank):
    names, b = batch_names("o", k, shape, core_rank)
    cores = [f"o{k}_{b + j}" for j in range(core_rank)]
    operand_cores.append((cores, tuple(shape[b:])))
    return " ".join(names + cores)

  def result(k, shape, core_rank):
    names, b = batch_names("r", k, shape, core_rank)
    cores = []
    for j, size in enumerate(shape[b:]):
      shared = next((c[j] for c, s in operand_cores if j < len(s) and s[j] == size), None)
      if shared is None or shared in cores:
        shared = f"r{k}_{b + j}"
        replicated.append(shared)
      cores.append(shared)
    return " ".join(names + cores)

  lhs = ", ".join(operand(k, s, c) for k, (s, c) in
                  enumerate(zip(operand_shapes, operand_core_ranks)))
  rhs = ", ".join(result(k, s, c) for k, (s, c) in
                  enumerate(zip(result_shapes, result_core_ranks)))
  shared_names = set(rhs.replace(",", " ").split())
  replicated += [n for cores, _ in operand_cores for n in cores if n not in shared_names]
  # Shardy wants the special factors in the order factors first appear.
  order = list(dict.fromkeys(f"{lhs} {rhs}".replace(",", " ").split()))
  return f"{lhs} -> {rhs}", tuple(sorted(set(replicated), key=order.index))


def describe(target_name, operand_shapes, operand_core_ranks, result_shapes,
             result_core_ranks, *, input_layouts, output_layouts, input_output_aliases,
             has_side_effect, attribute_rule="") -> CallDescription:
  return CallDescription(
      target=target_name,
      operand_batch_ranks=tuple(len(s) - c for s, c in
                                zip(operand_shapes, operand_core_ranks)),
      result_batch_ranks=tuple(len(s) - c for s, c in
                               zip(result_shapes, result_core_ranks)),
      operand_layouts=tuple(map(tuple, input_layouts)),
      result_layouts=tuple(map(tuple, output_layouts)),
      aliases=tuple(sorted(map(tuple, input_output_aliases))),
      has_side_effect=bool(has_side_effect),
      attribute_rule=attribute_rule,
  )


def shardy_rule_attribute(ctx, operand_shapes, operand_core_ranks, result_shapes,
                          result_core_ranks, batch_shape, operand_types, result_types):
  """The ``sdy.sharding_rule`` attribute of a batchpart call, or None where
  none belongs (GSPMD, no operands, a fully manual region)."""
  if not (compat.use_shardy() and operand_shapes and not compat.is_manual_lowering(ctx)):
    return None
  rule, replicated = sharding_rule(operand_shapes, operand_core_ranks, result_shapes,
                                   result_core_ranks, batch_shape)
  return compat.sdy_sharding_rule(rule, operand_types, result_types, replicated)


def _ir_types(ctx, avals):
  return [compat.aval_to_ir_type(ctx.module_context, a) for a in avals]


def _lowering(ctx, *operands, target_name, operand_core_ranks, result_core_ranks,
              has_side_effect, input_layouts, output_layouts, input_output_aliases,
              attributes, attribute_rule, **_):
  avals_in, avals_out = ctx.avals_in, ctx.avals_out  # vmapped shapes, if any
  operand_shapes = [a.shape for a in avals_in]
  result_shapes = [a.shape for a in avals_out]
  batch_shape = check_spec(target_name, BatchSpec(operand_core_ranks, result_core_ranks),
                           operand_shapes, result_shapes)
  description = describe(
      target_name, operand_shapes, operand_core_ranks, result_shapes, result_core_ranks,
      input_layouts=input_layouts, output_layouts=output_layouts,
      input_output_aliases=input_output_aliases, has_side_effect=has_side_effect,
      attribute_rule=attribute_rule)
  name = targets.ensure_derived(description, compat.lowering_platforms(ctx),
                                caller=f"batchpart.ffi_call('{target_name}')")
  note_called(target_name)
  extra = {"mhlo.frontend_attributes": compat.ir_attribute(
      {"num_batch_dims": str(len(batch_shape))})}
  rule = shardy_rule_attribute(ctx, operand_shapes, operand_core_ranks, result_shapes,
                               result_core_ranks, batch_shape, _ir_types(ctx, avals_in),
                               _ir_types(ctx, avals_out))
  if rule is not None:
    extra["sdy.sharding_rule"] = rule
  attrs = compat.unwrap_kwargs_hashable(tuple((k, v) for k, _, v in attributes))
  config = {k: compat.ir_attribute(v) for k, v in attrs.items()}
  return emit.custom_call(name, description, operands, _ir_types(ctx, avals_out), config,
                          extra_attributes=extra)


compat.register_lowering(batchpart_ffi_call_p, _lowering)
