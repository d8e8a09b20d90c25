"""jax.export: programs that carry batchpart calls.

An artifact exported where XLA partitions carries derived target names; one
exported on one device (or inside a fully manual region) carries user-named
calls with the derived name in a frontend attribute. When an artifact is
called (jax's ``call_exported`` inlines its functions into the caller's
module), each batchpart call in the inlined functions is made a call of the
caller's kind: where the caller is partitioned by XLA, it gets its derived
name, its partitioner registered, and (under Shardy) a sharding rule if it
was exported without one (under GSPMD); elsewhere it is left as exported.

The export safety check allows a derived name whenever it allows the user's
target: named by ``DisabledSafetyCheck.custom_call(target)``, or on jax's own
list of stable targets (jaxlib's LAPACK targets after
``partition_primitive``).

A call whose description names ``jax.numpy`` functions (a ``bp.Combiner``'s
merge, a parallel ``bp.Scan``'s merge and apply) carries them when it is
lowered for export (``carried_functions``): the ``batchpart.functions``
attribute maps each name to what ``lowered_functions`` exported of it. The
caller registers them before it partitions the call, so the artifact runs
sharded in a process that never ran the code that declared them. XLA drops
the attribute when it reads the module.
"""

from __future__ import annotations

import dataclasses

from batchpart import _compat as compat, _stablehlo
from batchpart._partition import sharding_rule, targets
from batchpart._vocab import derived_names
from batchpart._vocab.batch_spec import BatchSpec, check_spec
from batchpart._vocab.dims import scan, user_combiner
from batchpart._vocab.dims.reduced import splits_reductions
from batchpart._vocab.dims.scan import as_halos
from batchpart._vocab.dims.user_combiner import is_user_combiner
from batchpart._vocab.lowered_functions import Registry

ir = compat.ir


def _shapes(values) -> list[tuple[int, ...]]:
  return [tuple(ir.RankedTensorType(v.type).shape) for v in values]


def _add_sharding_rule(op, d) -> None:
  """Gives a derived call exported without a Shardy rule (under GSPMD) the
  rule its lowering would have given it."""
  operand_shapes, result_shapes = _shapes(op.operands), _shapes(op.results)
  if not operand_shapes or not result_shapes:
    return
  spec = BatchSpec(tuple(r - b - p for r, b, p in
                         zip(d.operand_ranks, d.operand_batch_ranks, d.operand_leads)),
                   tuple(r - b - p for r, b, p in
                         zip(d.result_ranks, d.result_batch_ranks, d.result_leads)),
                   d.operand_lead_ranks, d.result_lead_ranks)
  batch_shape = check_spec(f"batchpart (an exported call to '{d.target}')", spec,
                           operand_shapes, result_shapes)
  op.attributes["sdy.sharding_rule"] = sharding_rule.attribute_for_types(
      operand_shapes, spec.operand_core_ranks, result_shapes, spec.result_core_ranks,
      batch_shape, [v.type for v in op.operands], [r.type for r in op.results],
      operand_lead_ranks=spec.operand_lead_ranks, result_lead_ranks=spec.result_lead_ranks,
      reductions=d.reductions, halos=d.halos + as_halos(d.scans))


def _drop_frontend_attribute(op, name: str) -> None:
  entries = {a.name: a.attr
             for a in ir.DictAttr(op.attributes["mhlo.frontend_attributes"])  # type: ignore[attr-defined]  # jaxlib's MLIR stubs omit it
             if a.name != name}
  op.attributes["mhlo.frontend_attributes"] = ir.DictAttr.get(entries)


#: the attribute of a call exported with the functions its description names
CARRIED_ATTRIBUTE = "batchpart.functions"


def _named_functions(d) -> list[tuple[Registry, str]]:
  """The registry and name of each function ``d`` names: a Combiner's merge,
  a parallel Scan's merge and apply."""
  out: list[tuple[Registry, str]] = [(user_combiner.COMBINERS, str(r.op))
                                     for r in d.reductions if is_user_combiner(r.op)]
  return out + [(scan.SCANS, str(s.fold)) for s in d.scans if s.parallel]


def carried_functions(ctx, d) -> dict:
  """The extra attribute of a call lowered for ``jax.export`` whose
  description ``d`` names functions: each one as ``lowered_functions``
  carries it; empty otherwise."""
  named = _named_functions(d)
  if not named or not compat.lowering_for_export(ctx):
    return {}
  platform = compat.lowering_platforms(ctx)[0]
  return {CARRIED_ATTRIBUTE: ir.DictAttr.get({
      name: ir.StringAttr.get(registry.carried(name, platform)) for registry, name in named})}


def _adopt_carried(op, d) -> None:
  """Registers the functions the artifact's call ``op`` carries, then
  raises ``ValueError`` naming the target where one ``d`` names is neither
  carried nor lowered in this process."""
  if CARRIED_ATTRIBUTE in op.attributes:
    registries = {name: registry for registry, name in _named_functions(d)}
    for entry in ir.DictAttr(op.attributes[CARRIED_ATTRIBUTE]):  # type: ignore[attr-defined]  # jaxlib's MLIR stubs omit it
      if entry.name in registries:
        registries[entry.name].adopt(entry.name, ir.StringAttr(entry.attr).value, d.target)
  for registry, name in _named_functions(d):
    registry.get(name, d.target)


def adopt_exported_calls(ctx, ops) -> list[str]:
  """Makes the batchpart calls in ``ops`` (functions inlined from an
  exported artifact) calls of the caller's kind; returns their derived
  names."""
  partitioned = compat.xla_partitions(ctx)
  wanted = {compat.xla_platform_name(p) for p in compat.lowering_platforms(ctx)}
  names = []
  for top in ops:
    for op in [top, *_stablehlo.walk(top.operation)]:
      if op.operation.name != "stablehlo.custom_call":
        continue
      name = _stablehlo.derived_name(op)
      if name is None:
        continue
      names.append(name)
      if not partitioned:
        continue   # runs as exported: the user's target, or passes through
      d = derived_names.decode(name)
      _adopt_carried(op, d)
      if (d.reductions or d.halos or d.scans) and not splits_reductions(ctx):
        d = dataclasses.replace(d, reductions=(), halos=(), scans=())
        name = derived_names.encode(d)
        if "sdy.sharding_rule" in op.attributes:
          del op.attributes["sdy.sharding_rule"]
      local = compat.platforms_with_handler(d.target)
      local = [p for p in local if p in wanted] or local
      if not local:
        continue   # XLA's compile error names the target
      targets.ensure_derived_name(name, local)
      if _stablehlo.string_attribute(op.attributes, "call_target_name") != name:
        op.attributes["call_target_name"] = ir.StringAttr.get(name)
        _drop_frontend_attribute(op, derived_names.FRONTEND_ATTRIBUTE)
      if compat.use_shardy() and "sdy.sharding_rule" not in op.attributes:
        _add_sharding_rule(op, d)
  return names


def _allow_derived_names(module, disabled_checks) -> list:
  allowed = {compat.disabled_custom_call_target(c) for c in disabled_checks} - {None}
  allowed |= compat.stable_custom_call_targets()
  names = {n for n in _stablehlo.custom_call_targets(module)
           if derived_names.is_derived(n)}
  return [compat.custom_call_check(n) for n in sorted(names)
          if derived_names.user_target(n) in allowed]


def install() -> None:
  compat.after_exported_call_lowering(adopt_exported_calls)
  compat.extend_export_safety_checks(_allow_derived_names)
