"""Registers batchpart's CUDA kernels (cuSOLVER/cuBLAS) as XLA FFI targets.

The CUDA module ``batchpart._cuda`` (cc/cusolver/) is built only where CMake
found nvcc and cuSOLVER/cuBLAS (see docs/gpu.md). Its handlers have the same
target names and contracts as the CPU LAPACK kernels (cc/common/contracts.h),
registered for platform ``"CUDA"`` through ``batchpart.register_ffi_target``
(which calls ``jax.ffi.register_ffi_target(name, capsule, platform="CUDA")``),
as the CPU targets are. A custom call names only its target; XLA resolves the
name in the handler registry of the platform the program is compiled for, so
``batchpart.linalg`` lowers once for every platform and the CPU and GPU
handlers never meet. Each call's derived target is registered on every
platform the lowering targets, and its partitioner on the CPU client and
every PJRT plugin (batchpart/_compat/partitioner.py), so it covers the CUDA plugin too.

``register()`` does nothing (and loads no CUDA library) unless the module was
built and jax has CUDA devices.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import threading
import warnings

import jax

PLATFORM = "CUDA"

# Loaded before batchpart._cuda when pip's NVIDIA wheels are installed, so
# the module resolves them even when its runpath does not lead there (e.g. a
# build tree). libcusolver finds its own dependencies next to it ($ORIGIN).
_WHEEL_LIBRARIES = ("libcublasLt.so.13", "libcublas.so.13", "libcusolver.so.12")

_lock = threading.Lock()
_registered: bool | None = None  # None: not decided yet


def available() -> bool:
  """Whether the CUDA module was built (without importing it)."""
  try:
    return importlib.util.find_spec("batchpart._cuda") is not None
  except (ImportError, ValueError):
    return False


def has_cuda_devices() -> bool:
  """Whether jax has a CUDA backend with at least one device. Initializes
  jax's backends (as any computation would), nothing else."""
  try:
    return len(jax.devices("cuda")) > 0
  except RuntimeError:  # no CUDA backend (plugin missing, no GPU, jax_platforms)
    return False


def _preload_wheel_libraries() -> None:
  try:
    spec = importlib.util.find_spec("nvidia.cu13")
  except (ImportError, ValueError):
    return
  if spec is None or not spec.submodule_search_locations:
    return
  for directory in spec.submodule_search_locations:
    for name in _WHEEL_LIBRARIES:
      path = os.path.join(directory, "lib", name)
      if os.path.exists(path):
        try:
          ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        except OSError:
          pass  # the import below reports what is missing


def register() -> bool:
  """Registers every target of ``_cuda.handlers()`` for platform "CUDA" (once).

  Returns whether the CUDA handlers are registered: False where the CUDA
  module was not built or jax has no CUDA devices (nothing is imported then),
  and, with a warning, where the module was built but cannot be loaded (e.g.
  cuSOLVER missing at run time).
  """
  global _registered
  with _lock:
    if _registered is not None:
      return _registered
    _registered = False
    if not available() or not has_cuda_devices():
      return False
    _preload_wheel_libraries()
    try:
      from batchpart import _cuda
    except ImportError as error:
      warnings.warn(
          f"batchpart: jax has CUDA devices, but the CUDA kernels (batchpart._cuda) cannot be "
          f"loaded ({error}); batchpart.linalg will not compile for the GPU. Install "
          f"nvidia-cusolver and nvidia-cublas (pip install 'batchpart[cuda]').",
          RuntimeWarning, stacklevel=2)
      return False
    from batchpart._frontend.registry import register_ffi_target
    for name, capsule in _cuda.handlers().items():
      register_ffi_target(name, capsule, platform=PLATFORM)  # with XLA, and batch partitionable
    _registered = True
    return True
