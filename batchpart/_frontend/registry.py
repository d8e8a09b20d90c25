"""FFI target registration and the batch-partitionable target set."""

from __future__ import annotations

import ctypes
import threading
from typing import Any

import jax

from batchpart import _compat as compat
from batchpart._partition import declared

_lock = threading.RLock()
_handlers: dict[tuple[str, str], object] = {}

_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_name = ctypes.pythonapi.PyCapsule_GetName
_capsule_name.restype = ctypes.c_char_p
_capsule_name.argtypes = [ctypes.py_object]


def _handler_identity(handler: Any) -> Any:
  """What makes two handlers the same: the function pointer a capsule holds
  (two capsules may wrap one function), recursively for handler bundles."""
  if isinstance(handler, dict):
    return tuple(sorted((k, _handler_identity(v)) for k, v in handler.items()))
  if type(handler).__name__ == "PyCapsule":
    return ("capsule", _capsule_pointer(handler, _capsule_name(handler)))
  return ("object", id(handler))


def register_ffi_target(name: str, handler: Any, *, platform: str = "cpu",
                        api_version: int = 1) -> None:
  """Registers an FFI handler with XLA and marks the target batch partitionable.

  Args:
    name: the target name that ``batchpart.ffi_call`` and ``jax.ffi.ffi_call``
      will use.
    handler: a PyCapsule wrapping an ``XLA_FFI_Handler*`` (or, for
      ``api_version=0``, a legacy custom-call function), or a dict of such
      capsules for multi-stage handlers, as ``jax.ffi.register_ffi_target``
      accepts.
    platform: the XLA platform, e.g. ``"cpu"`` or ``"CUDA"``.
    api_version: 1 for the typed FFI (the default), 0 for the legacy API.

  Raises:
    ValueError: if ``name`` is already registered on ``platform`` with a
      different handler. Registering the same handler again does nothing.
  """
  if not isinstance(name, str) or not name:
    raise TypeError(f"batchpart.register_ffi_target: name must be a non-empty "
                    f"str, got {name!r}.")
  _check_handler(name, handler)
  key = (name, platform.lower())
  identity = _handler_identity(handler)
  with _lock:
    if key in _handlers:
      if _handlers[key] != identity:
        raise ValueError(
            f"batchpart.register_ffi_target: FFI target '{name}' is already "
            f"registered on platform '{platform}' with a different handler. "
            "Target names are process-global; pick another name.")
    else:
      try:
        jax.ffi.register_ffi_target(name, handler, platform=platform,
                                    api_version=api_version)
      except Exception as e:
        raise ValueError(f"batchpart.register_ffi_target: registering FFI target "
                         f"'{name}' on platform '{platform}' failed: {e}") from e
      compat.note_registered(name, platform, api_version)
      _handlers[key] = identity
    declared.declare(name)


def _is_capsule(x: object) -> bool:
  return type(x).__name__ == "PyCapsule"


def _check_handler(name: str, handler: Any) -> None:
  # jax only queues a handler until the backend starts, so a bad one would
  # otherwise surface later as a backend failure that names no target.
  ok = _is_capsule(handler) or (
      isinstance(handler, dict) and handler and all(
          isinstance(k, str) and _is_capsule(v) for k, v in handler.items()))
  if not ok:
    raise TypeError(
        f"batchpart.register_ffi_target: the handler for FFI target '{name}' must be a "
        f"PyCapsule wrapping an XLA_FFI_Handler* (e.g. from nanobind or "
        f"jax.ffi.pycapsule), or a dict of them; got {type(handler).__name__}.")


def mark_batch_partitionable(name: str) -> None:
  """Declares an FFI target (registered by anyone) batch partitionable.

  Calls to ``name`` made through ``batchpart.ffi_call`` (or inside a
  ``batchpart.batch_partitionable`` wrapper) are partitioned by batchpart
  under Shardy and GSPMD, marked or not; marking records the declaration
  (``is_batch_partitionable``) and checks the target exists. Plain
  ``jax.ffi.ffi_call`` calls to ``name`` are unaffected: batchpart partitions its
  own calls under derived target names and never gives ``name`` itself a
  partitioner. Idempotent.

  Args:
    name: the FFI target name, as registered.

  Raises:
    TypeError: if ``name`` is not a non-empty string.
    ValueError: if ``name`` has no typed-FFI handler registered on any
      platform (register it first), or only a legacy (``api_version=0``) one.
  """
  if not isinstance(name, str) or not name:
    raise TypeError(f"batchpart.mark_batch_partitionable: name must be a "
                    f"non-empty str, got {name!r}.")
  with _lock:
    if declared.is_declared(name):
      return
    if not compat.platforms_with_handler(name):
      if compat.platforms_with_handler(name, api="legacy"):
        raise ValueError(
            f"batchpart.mark_batch_partitionable: FFI target '{name}' is registered with "
            "the legacy custom-call API (api_version=0); batchpart partitions typed-FFI "
            "calls only.")
      raise ValueError(
          f"batchpart.mark_batch_partitionable: FFI target '{name}' is not registered "
          "on any platform. Register its typed FFI handler first with "
          "batchpart.register_ffi_target or jax.ffi.register_ffi_target.")
    declared.declare(name)


def is_batch_partitionable(name: str) -> bool:
  """Whether ``name`` was marked batch partitionable, or called through batchpart.

  Args:
    name: an FFI target name.

  Returns:
    True if ``name`` was registered with :func:`batchpart.register_ffi_target`,
    marked with :func:`batchpart.mark_batch_partitionable`, or called through
    batchpart in this process; False otherwise.
  """
  return declared.is_declared(name)
