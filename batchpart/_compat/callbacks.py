"""Host callbacks (``bp.pure_callback``, ``bp.io_callback``): jax's callback
effect, result checks and host-callback custom-call targets.

Checked against jax/jaxlib 0.10.2 and 0.12.x (``versions``).

- ``jax._src.callback``: the unordered IO effect of
  ``jax.experimental.io_callback`` and its result dtype check.
- ``mlir.ModuleContext.add_host_callback`` and the typed-FFI targets
  ``xla_ffi_python_{cpu,gpu}_callback`` (NumPy copies in, arrays returned)
  and ``xla_buffer_python_{cpu,gpu}_callback`` (``bp.buffer_callback``:
  XLA's buffers in place): the callable is handed to the compiler with the
  module and held by the executable, never in a batchpart table.
- ``jax._src.dispatch``: primitives that need a backend while lowering.
- ``jax._src.callback`` / ``jax._src.buffer_callback``: the callback
  primitives ``bp.partition_callback`` puts its dispatcher on, and jax's flat
  wrapper (``_FlatCallback``: ``callback_func``, ``in_tree``) around the
  user's function in their ``callback`` parameter.
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


def buffer_callback_target(platform: str) -> str | None:
  """jax's in-place host callback target for a lowering platform (None where
  jax has none): it calls ``host_callbacks[index](ExecutionContext, *operand
  Buffers, *result Buffers)`` and expects the result buffers written in
  place."""
  device = {"cpu": "cpu", "cuda": "gpu", "rocm": "gpu"}.get(platform)
  return None if device is None else f"xla_buffer_python_{device}_callback"


def canonicalize_value(x):
  """A callback result as jax canonicalizes it (float64 -> float32 where
  x64 is off)."""
  from jax._src import dtypes
  return dtypes.canonicalize_value(x)


def check_result_shape_dtype(shape_dtype) -> None:
  """jax's check that a callback's declared result dtype is canonical."""
  from jax._src import callback as jax_callback
  jax_callback._check_shape_dtype(shape_dtype)


def jax_callback_primitives() -> dict:
  """jax's callback primitives ``bp.partition_callback`` adopts, each with
  the kind of batchpart callback it becomes: ``jax.pure_callback``'s,
  ``jax.experimental.io_callback``'s and ``buffer_callback``'s."""
  from jax._src import buffer_callback as jax_buffer_callback, callback as jax_callback
  return {jax_callback.pure_callback_p: "pure_callback",
          jax_callback.io_callback_p: "io_callback",
          jax_buffer_callback.buffer_callback_p: "buffer_callback"}


def jax_callback_function(callback_param):
  """The function a user passed to ``jax.pure_callback`` / ``io_callback``
  and its ``(args, kwargs)`` tree, from the primitive's ``callback``
  parameter (jax's flat wrapper); ``(callback_param, None)`` for anything
  else (``buffer_callback``'s parameter is the user's function itself)."""
  from jax._src import callback as jax_callback
  if isinstance(callback_param, jax_callback._FlatCallback):
    return callback_param.callback_func, callback_param.in_tree
  return callback_param, None
