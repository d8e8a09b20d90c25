"""jax.export: programs that carry derived target names.

A deserialized module names derived targets that this process may never have
lowered: they are registered when the module is lowered into a program. And
``jax.export.DisabledSafetyCheck.custom_call(target)`` for the target the
user wrote also allows its derived names.
"""

from __future__ import annotations

from batchpart import _compat as compat, _stablehlo
from batchpart._partition import derived_names, targets


def register_module_targets(module, platforms=None) -> list[str]:
  """Registers every derived target ``module`` calls, on those of
  ``platforms`` (default: every platform) its user target has; returns them."""
  names = sorted({n for n in _stablehlo.custom_call_targets(module)
                  if derived_names.is_derived(n)})
  for name in names:
    user = derived_names.user_target(name)
    local = compat.platforms_with_handler(user)
    if platforms is not None:
      wanted = {compat.xla_platform_name(p) for p in platforms}
      local = [p for p in local if p in wanted] or local
    if local:
      targets.ensure_derived_name(name, local)
    # else: XLA's compile error names the derived target, hence the user's.
  return names


def _allow_derived_names(module, disabled_checks) -> list:
  allowed = {compat.disabled_custom_call_target(c) for c in disabled_checks} - {None}
  if not allowed:
    return []
  names = {n for n in _stablehlo.custom_call_targets(module)
           if derived_names.is_derived(n)}
  return [compat.custom_call_check(n) for n in sorted(names)
          if derived_names.user_target(n) in allowed]


def install() -> None:
  compat.on_exported_call_lowering(register_module_targets)
  compat.extend_export_safety_checks(_allow_derived_names)
