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
- ``pxla.batched_device_put``, ``config.default_device`` and the empty
  meshes: handing a callback ``jax.Array``s on the CPU device as jax's own
  callbacks do (``arrays="jax"``), without a transfer.
- ``jax._src.callback`` / ``jax._src.buffer_callback``: the callback
  primitives ``bp.partition_callback`` puts its dispatcher on, and jax's flat
  wrapper (``_FlatCallback``: ``callback_func``, ``in_tree``) around the
  user's function in their ``callback`` parameter.
"""

from __future__ import annotations

import contextlib
import functools
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


# jaxlib's CPU client aliases a host buffer this aligned (and C-contiguous)
# instead of copying it; a copy of a large buffer runs as a task on the
# client's thread pool, which devices blocked in a collective may hold.
HOST_ARRAY_ALIGNMENT = 64


def callback_cpu_device():
  """The CPU device jax's own callbacks put their operands on: the first
  local one (RuntimeError where jax runs without a CPU backend)."""
  from jax._src import xla_bridge
  return xla_bridge.local_devices(backend="cpu")[0]


@functools.lru_cache(maxsize=1024)
def _aval(shape: tuple, dtype):
  from jax._src import core
  return core.ShapedArray(shape, dtype)


@functools.lru_cache(maxsize=64)
def _single_device_sharding(device):
  from jax.sharding import SingleDeviceSharding
  return SingleDeviceSharding(device)


def import_host_array(x, device):
  """A ``jax.Array`` on CPU ``device`` over ``x``'s memory: no copy and no
  work on a device where ``x`` is C-contiguous and ``HOST_ARRAY_ALIGNMENT``
  aligned (jax's ``device_put`` without its per-call Python layers)."""
  from jax._src.interpreters import pxla
  return pxla.batched_device_put(_aval(x.shape, x.dtype), _single_device_sharding(device),
                                 [x], [device])


@contextlib.contextmanager
def jax_callback_scope(device):
  """What jax's callback implementations enter around the user's function:
  ``device`` as the default device and no mesh (the callback may run on a
  thread that has one set)."""
  from jax._src import config, mesh as mesh_lib, sharding_impls
  with (config.default_device(device),
        sharding_impls._internal_use_concrete_mesh(mesh_lib.empty_concrete_mesh),
        mesh_lib.use_abstract_mesh(mesh_lib.empty_abstract_mesh)):
    yield
