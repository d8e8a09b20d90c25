"""``jax.export``: the lowering of a deserialized artifact's call, and the
custom-call safety check with its list of stable targets.

Checked against jax/jaxlib 0.10.2 and 0.12.x (``versions``).

- ``jax._src.export._export``: ``call_exported_p``'s lowering (the calls an
  artifact brings are made partitionable in the caller), ``_check_module``
  and ``_CUSTOM_CALL_TARGETS_GUARANTEED_STABLE``, so
  ``DisabledSafetyCheck.custom_call(name)`` and jax's stable targets cover
  their derived names.
- ``ModuleContext.lowering_parameters.for_export``: whether a lowering is
  for ``jax.export`` (its calls then carry the functions they need).
- ``jax._src.interpreters.mlir.refine_polymorphic_shapes``: a function that
  calls a shape-polymorphic artifact, lowered on static shapes, made static
  (as jax's own compile does).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
from jax._src.interpreters import mlir


def after_exported_call_lowering(callback: Callable) -> None:
  """Calls ``callback(ctx, ops)`` whenever a deserialized ``jax.export``
  artifact has been lowered into a program (jax's ``call_exported``
  primitive), with the top-level ops that lowering added to the caller's
  module (the artifact's inlined functions)."""
  from jax._src.export import _export
  prim = _export.call_exported_p
  entry = mlir._lowerings[prim]
  original = entry.rule
  if getattr(original, "_batchpart_hook", False):
    return

  def lowering(ctx, *args, exported, **params):
    body = ctx.module_context.module.body
    before = {hash(op.operation) for op in body.operations}
    out = original(ctx, *args, exported=exported, **params)
    callback(ctx, [op for op in body.operations if hash(op.operation) not in before])
    return out

  lowering._batchpart_hook = True  # type: ignore[attr-defined]  # a marker on our own function
  mlir.register_lowering(prim, lowering, inline=entry.inline)


def lowering_for_export(ctx) -> bool:
  """Whether the lowering ``ctx`` belongs to is for ``jax.export``; True
  where jax does not say (carrying what an artifact needs is then safe)."""
  return bool(getattr(ctx.module_context.lowering_parameters, "for_export", True))


def refined_module_text(module) -> str:
  """``module`` (lowered on static argument shapes) with the dynamic shapes
  of the shape-polymorphic artifacts it calls resolved, as text."""
  return str(mlir.refine_polymorphic_shapes(module))


def stable_custom_call_targets() -> set[str]:
  """The custom-call targets jax.export allows without a disabled check."""
  from jax._src.export import _export
  return set(_export._CUSTOM_CALL_TARGETS_GUARANTEED_STABLE)


def extend_export_safety_checks(extra_checks: Callable) -> None:
  """Wraps jax.export's module check so that ``extra_checks(module,
  disabled_checks)`` can add disabled checks (derived target names of the
  targets the user allowed)."""
  from jax._src.export import _export
  original = _export._check_module
  if getattr(original, "_batchpart_hook", False):
    return

  def check_module(mod, *, disabled_checks, **kwargs):
    disabled = list(disabled_checks) + list(extra_checks(mod, disabled_checks))
    return original(mod, disabled_checks=disabled, **kwargs)

  check_module._batchpart_hook = True  # type: ignore[attr-defined]  # as above
  _export._check_module = check_module


def disabled_custom_call_target(check) -> str | None:
  """The target a ``DisabledSafetyCheck`` allows, or None for another check."""
  return check.is_custom_call()


def custom_call_check(target: str):
  """The ``DisabledSafetyCheck`` that allows custom calls to ``target``."""
  return jax.export.DisabledSafetyCheck.custom_call(target)
