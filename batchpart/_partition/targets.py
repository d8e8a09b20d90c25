"""Derived targets: the user's FFI handler and batchpart's partitioner,
registered under a call's derived name on first use.

The state here is a set of names already registered: it grows with the
number of distinct descriptions (target x batch ranks x layouts x aliases x
side effect), never with the number of programs, and it only answers
"registered yet?" — no partitioning decision reads it.
"""

from __future__ import annotations

import threading

from batchpart import _compat as compat
from batchpart._partition import callbacks, derived_names
from batchpart._partition.description import CallDescription

_lock = threading.Lock()
_handlers: set[tuple[str, str]] = set()  # (derived name, XLA platform)
_partitioners: set[str] = set()


class TargetNotRegisteredError(ValueError):
  pass


def ensure_derived(d: CallDescription, platforms, *, caller: str) -> str:
  """Registers the derived target of ``d`` on ``platforms`` (jax names) and
  returns its name.

  Raises:
    TargetNotRegisteredError: naming the target, if it has a typed-FFI
      handler on none of ``platforms``.
  """
  name = derived_names.encode(d)
  with _lock:
    found = []
    for platform in platforms:
      xla_platform = compat.xla_platform_name(platform)
      if (name, xla_platform) in _handlers:
        found.append(platform)
        continue
      handler = compat.registered_handler(d.target, platform)
      if handler is None:
        continue
      compat.register_handler(name, handler, platform)
      _handlers.add((name, xla_platform))
      found.append(platform)
    if not found:
      raise TargetNotRegisteredError(
          f"{caller}: FFI target '{d.target}' has no typed FFI handler registered on "
          f"platform {', '.join(platforms) or '(none)'}. Register it first with "
          "batchpart.register_ffi_target or jax.ffi.register_ffi_target (batchpart "
          "partitions typed-FFI calls, custom_call_api_version=4).")
    if name not in _partitioners:
      callbacks.register(name, d)
      _partitioners.add(name)
  return name


def ensure_derived_name(name: str, platforms) -> None:
  """Registers a derived name read from a module (e.g. a deserialized
  jax.export artifact) on those of ``platforms`` the user's target has."""
  d = derived_names.decode(name)
  ensure_derived(d, platforms, caller=f"batchpart (loading '{name}')")


def registered_counts() -> dict[str, int]:
  """How many derived handlers and partitioners this process holds."""
  with _lock:
    return {"handlers": len(_handlers), "partitioners": len(_partitioners)}
