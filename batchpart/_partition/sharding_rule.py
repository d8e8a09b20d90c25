"""The Shardy sharding rule of a batchpart call (``sdy.sharding_rule``).

One factor per batch dim, shared by every operand and result that has it
(wherever its batch dims sit: after leading core dims too). A
result's core dim shares the factor of the same core dim at the same core
position of the first operand with that size there (its input's layout, as
for an elementwise op), so a core-sharded input gives a result sharded the
same way instead of a replicated one; batchpart's partitioner still runs the
kernel on batch shards. Every other core dim, and every broadcast size-1
batch dim, is a factor of its own that needs replication, so Shardy never
pushes a sharding onto it. A reduced core dim (``reduce=``) is one factor
shared by every operand that has it, a reduction factor: Shardy keeps it
sharded and batchpart's partitioner adds the all-reduce. Where a result
keeps that dim, the result shares the factor too (it is then no reduction
factor, which Shardy allows only in operands), so the result stays split
along it. A halo dim (``halo=``) is one factor shared by every operand and
result that has it, as a batch dim is: Shardy keeps it sharded through the
call, and batchpart's partitioner adds the halo exchange.
"""

from __future__ import annotations

from batchpart import _compat as compat
from batchpart._vocab.dims.core import absolute_dim


def factors(operand_shapes, operand_core_ranks, result_shapes, result_core_ranks,
            batch_shape, operand_lead_ranks=(), result_lead_ranks=(), reductions=(),
            halos=()) -> tuple[list[list[str]], list[list[str]], tuple[str, ...], tuple[str, ...]]:
  """Each operand's and result's factor per dim, the factors that need
  replication (in the order they first appear, as Shardy wants) and the
  reduction factors. An array's core dims are its ``*_lead_ranks`` leading
  dims (none if empty) and its ``*_core_ranks`` trailing ones, in that
  order; its batch dims lie between."""
  rank = len(batch_shape)
  replicated: list[str] = []
  reduced = {(k, absolute_dim(axis, len(operand_shapes[k]))): f"x{i}"
             for i, r in enumerate(reductions) for k, axis in r.dims}
  kept = {(k, absolute_dim(axis, len(result_shapes[k]))): f"x{i}"
          for i, r in enumerate(reductions) for k, axis in r.results}
  haloed = {(kind, k, absolute_dim(axis, len(shapes[k]))): f"h{i}"
            for i, h in enumerate(halos)
            for kind, dims, shapes in (("o", h.operand_dims, operand_shapes),
                                       ("r", h.result_dims, result_shapes))
            for k, axis in dims}
  operand_cores: list[tuple[list[str], tuple[int, ...]]] = []
  operand_leads = operand_lead_ranks or (0,) * len(operand_shapes)
  result_leads = result_lead_ranks or (0,) * len(result_shapes)

  def batch_names(prefix, k, shape, lead, core_rank):
    b = len(shape) - core_rank - lead
    names = []
    for m in range(b):
      if shape[lead + m] == batch_shape[rank - b + m]:
        names.append(f"b{rank - b + m}")
      else:
        names.append(f"{prefix}{k}_{lead + m}")
        replicated.append(names[-1])
    return names, [*range(lead), *range(lead + b, len(shape))]

  def operand(k, shape, lead, core_rank):
    names, core_dims = batch_names("o", k, shape, lead, core_rank)
    cores = [haloed.get(("o", k, dim), reduced.get((k, dim), f"o{k}_{dim}"))
             for dim in core_dims]
    operand_cores.append((cores, tuple(shape[dim] for dim in core_dims)))
    return cores[:lead] + names + cores[lead:]

  def result(k, shape, lead, core_rank):
    names, core_dims = batch_names("r", k, shape, lead, core_rank)
    cores: list[str] = []
    for j, dim in enumerate(core_dims):
      if (k, dim) in kept:
        cores.append(kept[k, dim])
        continue
      if ("r", k, dim) in haloed:
        cores.append(haloed[("r", k, dim)])
        continue
      size = shape[dim]
      shared = next((c[j] for c, s in operand_cores if j < len(s) and s[j] == size), None)
      if (shared is None or shared in cores or shared in reduced.values() or
          shared in haloed.values()):
        shared = f"r{k}_{dim}"
        replicated.append(shared)
      cores.append(shared)
    return cores[:lead] + names + cores[lead:]

  lhs = [operand(k, s, lead, c) for k, (s, c, lead) in
         enumerate(zip(operand_shapes, operand_core_ranks, operand_leads))]
  rhs = [result(k, s, lead, c) for k, (s, c, lead) in
         enumerate(zip(result_shapes, result_core_ranks, result_leads))]
  shared_names = {n for names in rhs for n in names}
  replicated += [n for cores, _ in operand_cores for n in cores
                 if n not in shared_names and n not in reduced.values()]
  order = list(dict.fromkeys(n for names in lhs + rhs for n in names))
  reduction_factors = set(reduced.values()) - set(kept.values())
  return (lhs, rhs, tuple(sorted(set(replicated), key=order.index)),
          tuple(sorted(reduction_factors, key=order.index)))


def text(lhs, rhs) -> str:
  """The rule in jax's einsum-like notation, for messages and tests."""
  fmt = lambda side: ", ".join(" ".join(names) for names in side)
  return f"{fmt(lhs)} -> {fmt(rhs)}"


def attribute(ctx, operand_shapes, operand_core_ranks, result_shapes, result_core_ranks,
              batch_shape, operand_types, result_types, *, operand_lead_ranks=(),
              result_lead_ranks=(), reductions=(), halos=()):
  """The ``sdy.sharding_rule`` attribute of a call XLA partitions, or None
  where none belongs (GSPMD, no operands, a region XLA does not partition) or
  none can be (Shardy's rules need a result)."""
  if not (compat.use_shardy() and operand_shapes and result_shapes and
          compat.xla_partitions(ctx)):
    return None
  return attribute_for_types(operand_shapes, operand_core_ranks, result_shapes,
                             result_core_ranks, batch_shape, operand_types, result_types,
                             operand_lead_ranks=operand_lead_ranks,
                             result_lead_ranks=result_lead_ranks, reductions=reductions,
                             halos=halos)


def attribute_for_types(operand_shapes, operand_core_ranks, result_shapes,
                        result_core_ranks, batch_shape, operand_types, result_types, *,
                        operand_lead_ranks=(), result_lead_ranks=(), reductions=(),
                        halos=()):
  """The ``sdy.sharding_rule`` attribute, unconditionally (zero results too)."""
  lhs, rhs, replicated, reduced = factors(
      operand_shapes, operand_core_ranks, result_shapes, result_core_ranks, batch_shape,
      operand_lead_ranks, result_lead_ranks, reductions, halos)
  return compat.sdy_sharding_rule(lhs, rhs, operand_types, result_types, replicated,
                                  reduced)
