"""Host callbacks (``bp.pure_callback``, ``bp.io_callback``): jax's callback
effect, result checks and host-callback custom-call targets.

Checked against jax/jaxlib 0.10.2 and 0.12.x (``versions``).

- ``jax._src.callback``: the unordered IO effect of
  ``jax.experimental.io_callback`` and its result dtype check.
- ``mlir.ModuleContext.add_host_callback`` and the typed-FFI targets
  ``xla_ffi_python_{cpu,gpu}_callback``: the callable is handed to the
  compiler with the module and held by the executable, never in a batchpart
  table.
- ``jax._src.dispatch``: primitives that need a backend while lowering.
"""

from __future__ import annotations

from collections.abc import Callable

from jax._src import dispatch
from jax._src.interpreters import mlir


def io_effect():
  """jax's unordered IO effect (``jax.experimental.io_callback``'s): keeps
  the call alive and is allowed inside control flow."""
  from jax._src import callback as jax_callback
  return jax_callback._IOEffect


def require_devices_during_lowering(primitive) -> None:
  """Marks ``primitive`` as needing a backend while lowering, as jax marks
  its own callback primitives."""
  dispatch.prim_requires_devices_during_lowering.add(primitive)


def register_uncached_lowering(primitive, rule: Callable) -> None:
  """A lowering rule whose output depends on the module being built (a host
  callback's index into its list of callbacks), so never reused."""
  mlir.register_lowering(primitive, rule, cacheable=False)


def add_host_callback(ctx, callable_) -> int:
  """Adds ``callable_`` to the host callbacks handed to the compiler with
  the module (the executable holds it until it dies); returns its index,
  the ``index`` attribute of jax's callback custom calls."""
  ctx.module_context.add_host_callback(callable_)
  return len(ctx.module_context.host_callbacks) - 1


def host_callback_target(platform: str) -> str:
  """jax's typed-FFI host callback target for a lowering platform: it calls
  ``host_callbacks[index](*numpy arrays)`` and copies the returned tuple of
  arrays into the result buffers."""
  device = "gpu" if platform in ("cuda", "rocm") else "cpu"
  return f"xla_ffi_python_{device}_callback"


def canonicalize_value(x):
  """A callback result as jax canonicalizes it (float64 -> float32 where
  x64 is off)."""
  from jax._src import dtypes
  return dtypes.canonicalize_value(x)


def check_result_shape_dtype(shape_dtype) -> None:
  """jax's check that a callback's declared result dtype is canonical."""
  from jax._src import callback as jax_callback
  jax_callback._check_shape_dtype(shape_dtype)
