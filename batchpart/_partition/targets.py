"""Derived targets: batchpart's partitioner, registered under a call's
derived name on first use.

Only a partitioner is registered, never a handler: a derived name is
emitted only where XLA's SPMD partitioner runs (``compat.xla_partitions``),
and the partitioner replaces it by a call to the user's own target. So no
executable ever runs a derived name, every stage of the user's handler
bundle (``instantiate`` included) serves every call, a legacy custom call is
never mistaken for a typed-FFI handler, and a serialized executable needs
nothing from batchpart to load.

The state here is the set of derived names with a partitioner (bounded by
the number of distinct descriptions) and the (target, platform) pairs seen
to have a typed-FFI handler; no partitioning decision reads either.
"""

from __future__ import annotations

import threading

from batchpart import _compat as compat
from batchpart._partition import attributes, callbacks
from batchpart._vocab import derived_names
from batchpart._vocab.description import CallDescription

_lock = threading.Lock()
_typed: set[tuple[str, str]] = set()   # (user target, XLA platform) with a typed handler
_partitioners: set[str] = set()


class TargetNotRegisteredError(ValueError):
  pass


def _require_typed_handler(target: str, platforms, caller: str) -> None:
  """Raises naming ``target`` unless it has a typed-FFI handler on one of
  ``platforms`` (jax names)."""
  found, legacy = False, []
  for platform in platforms:
    key = (target, compat.xla_platform_name(platform))
    if key in _typed:
      found = True
      continue
    api = compat.handler_api(target, platform)
    if api in ("ffi", "unknown"):   # unknown: XLA's compile names a missing one
      _typed.add(key)
      found = True
    elif api == "legacy":
      legacy.append(platform)
  if found:
    return
  if legacy:
    raise TargetNotRegisteredError(
        f"{caller}: FFI target '{target}' is registered with the legacy custom-call API "
        f"(api_version=0) on {', '.join(legacy)}; batchpart partitions typed-FFI calls "
        "only (jax.ffi.register_ffi_target with api_version=1). Call a legacy target "
        "with jax.ffi.ffi_call.")
  raise TargetNotRegisteredError(
      f"{caller}: FFI target '{target}' has no typed FFI handler registered on "
      f"platform {', '.join(platforms) or '(none)'}. Register it first with "
      "batchpart.register_ffi_target or jax.ffi.register_ffi_target (batchpart "
      "partitions typed-FFI calls, custom_call_api_version=4).")


def ensure_derived(d: CallDescription, platforms, *, caller: str,
                   rule: attributes.AttributeRule | None = None) -> str:
  """Registers batchpart's partitioner for the derived name of ``d`` (with
  ``rule``, whose digest ``d`` carries, bound into it) and returns the name.

  Raises:
    TargetNotRegisteredError: naming the target, if it has no typed-FFI
      handler on any of ``platforms`` (jax names).
  """
  if (rule.digest if rule is not None else "") != d.attribute_rule:
    raise AssertionError(f"{caller}: the description of '{d.target}' and its attribute "
                         "rule disagree")
  name = derived_names.encode(d)
  with _lock:
    _require_typed_handler(d.target, platforms, caller)
    if name not in _partitioners:
      # A name carries its rule's content digest: a rule registered under it
      # before computes what this one computes.
      callbacks.register(name, d, rule)
      _partitioners.add(name)
  return name


def ensure_derived_name(name: str, platforms) -> None:
  """Registers a derived name read from a module (e.g. a deserialized
  jax.export artifact) on those of ``platforms`` the user's target has."""
  d = derived_names.decode(name)
  rule = (attributes.rule_for_digest(d.attribute_rule, target=d.target)
          if d.attribute_rule else None)
  ensure_derived(d, platforms, caller=f"batchpart (loading '{name}')", rule=rule)


def registered_counts() -> dict[str, int]:
  """How many derived partitioners this process holds."""
  with _lock:
    return {"partitioners": len(_partitioners)}
