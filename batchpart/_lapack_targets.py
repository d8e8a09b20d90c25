"""Registers batchpart's CPU LAPACK kernels as XLA FFI targets.

The kernels (cc/lapack/) call LAPACK and BLAS through function pointers that
scipy exports from ``scipy.linalg.cython_lapack`` and
``scipy.linalg.cython_blas``, the way jaxlib does, so no system BLAS is
needed. ``register()`` hands those pointers to the compiled module and
registers one FFI target per operation for the CPU platform. Operand and
result contracts are documented in ``cc/common/contracts.h``; every matrix is
passed column-major (see ``column_major``), except to the row-major twins.

The targets in ``CPU_ONLY_TARGET_NAMES`` (``cc/lapack/option_kernels.h``)
serve options that LAPACK has and cuSOLVER's kernels here do not: pivoted and
raw QR, the QR-iteration SVD, the Cholesky solve; and the row-major LU,
solve, triangular solve and QR, which batchpart.linalg uses on CPU in place
of the column-major ones. They are registered for the CPU platform only;
batchpart.linalg refuses the options on other platforms.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence

# Targets the CUDA module lacks: their options raise NotImplementedError on a
# GPU, and the row-major twins are called on CPU only (batchpart.linalg
# checks the platform).
CPU_ONLY_TARGET_NAMES: tuple[str, ...] = (
  "batchpart_getrf_row_major",
  "batchpart_gesv_row_major",
  "batchpart_trsm_row_major",
  "batchpart_qr_row_major",
  "batchpart_geqrf",
  "batchpart_geqp3",
  "batchpart_gesvd",
  "batchpart_posv",
)

_lock = threading.Lock()
_registered = False


def register() -> None:
  """Initializes LAPACK and registers every target of the module's registration
  table, ``_core.lapack.handlers()`` (once)."""
  global _registered
  with _lock:
    if _registered:
      return
    from scipy.linalg import cython_blas, cython_lapack

    from batchpart import _core

    _core.lapack.initialize(cython_lapack.__pyx_capi__, cython_blas.__pyx_capi__)
    _core.lapack.set_blas_thread_control(_openblas_set_num_threads_local())
    from batchpart._frontend.registry import register_ffi_target
    for name, capsule in _core.lapack.handlers().items():
      register_ffi_target(name, capsule, platform="cpu")  # with XLA, and batch partitionable
    _registered = True


def _openblas_set_num_threads_local() -> int:
  """Address of ``openblas_set_num_threads_local`` in the OpenBLAS that
  scipy's cython_lapack calls, or 0 (then kernels leave BLAS threading as
  it is). Only scipy's bundled OpenBLAS wheels are looked at."""
  import ctypes
  import glob
  import os

  import scipy

  libs = os.path.join(os.path.dirname(os.path.dirname(scipy.__file__)), "scipy.libs")
  for path in sorted(glob.glob(os.path.join(libs, "*openblas*"))):
    try:
      function = ctypes.CDLL(path).openblas_set_num_threads_local
    except (OSError, AttributeError):
      continue
    return ctypes.cast(function, ctypes.c_void_p).value or 0
  return 0


def column_major(shape: Sequence[int]) -> tuple[int, ...] | None:
  """The major-to-minor layout the kernels expect for an array of `shape`.

  Matrices (rank >= 2) are column-major within each batch element; vectors
  and scalars keep the default layout (None). So do empty arrays: the kernel
  reads nothing from them, and jaxlib 0.10.2's CPU compiler dies with SIGFPE
  (EmitTiledFusionKernel) when it must relayout an empty operand such as
  (0, 0) or (2, 0, 0).
  """
  rank = len(shape)
  if rank < 2 or math.prod(shape) == 0:
    return None
  return (*range(rank - 2), rank - 1, rank - 2)
