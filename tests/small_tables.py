"""What the small-matrix kernel tests (tests/test_small_*.py) share: the
layouts the targets take, the sizes and batches every kernel is tried at,
the sizes around a switch point, where the fixed-size kernels run, the
modules' marks, and calling a target and both of its paths."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from batchpart import _core
from batchpart._lapack_targets import column_major
from batchpart.testing import lanes, small_path

#: Each module's marks: a time limit, float64 on and the LAPACK targets registered.
MARKS = [pytest.mark.timeout(300), pytest.mark.usefixtures("x64", "lapack_registered")]

#: The column-major targets and their row-major twins (the CPU's ops).
LAYOUTS = pytest.mark.parametrize("row_major", [False, True], ids=["column_major", "row_major"])
#: Sizes at and around multiples of the lane count, all below every switch point.
SIZES = (1, 2, 3, 7, 8, 16, 31, 32)
#: Batches that fill no group, and that leave their last group part-filled.
BATCHES = (1, 5, 17, 100)
#: The largest n with a fixed-size LU or Cholesky kernel (kMaxFixedLu,
#: kMaxFixedCholesky for the real types); the tests go one past it.
MAX_FIXED = 16
#: Whether the fixed-size kernels run on this CPU: they need AVX-512.
AVX512 = _core.lapack.supported_block_transposes() == "avx512"
FIXED_SIZE = pytest.mark.skipif(not AVX512, reason="the fixed-size kernels need AVX-512")


def sizes_around(high: int, low: int = 1, sizes=SIZES) -> list[int]:
  """`sizes` and the sizes on both sides of each end of a kernel's range
  [low, high], and the last but one."""
  return sorted({*sizes, *(n for n in (low - 1, low, high - 1, high, high + 1) if n > 0)})


def call(target, operands, results, row_major=False, **attributes):
  """The results of `target` (its ``_row_major`` twin with `row_major`) on the
  matrices `operands`, as numpy arrays, through ``jax.ffi.ffi_call`` with
  explicit layouts, so that either target runs as it is registered; `results`
  are (shape, dtype, whether it is a matrix)."""
  layout = (lambda shape: None) if row_major else column_major
  f = jax.ffi.ffi_call(
      f"{target}_row_major" if row_major else target,
      [jax.ShapeDtypeStruct(shape, np.dtype(dtype)) for shape, dtype, _ in results],
      input_layouts=[layout(np.shape(x)) for x in operands],
      output_layouts=[layout(shape) if matrix else None for shape, _, matrix in results])
  return tuple(np.asarray(r) for r in f(*operands, **attributes))


def both_paths(kernel, f, *args):
  """f(*args) with the small-matrix kernel family `kernel` on the interleaved
  kernel ("always") and on the per-matrix path ("never")."""
  with small_path(kernel, "always"):
    ours = f(*args)
  with small_path(kernel, "never"):
    theirs = f(*args)
  return ours, theirs


def past_a_group(make, dtype, shape, seed: int = 1):
  """``make(rng, (lanes + 1, *shape), dtype)``: one matrix past a full group
  of ``dtype``'s lanes, so one group is shared with a partial one; and the
  ``rng`` it drew from."""
  rng = np.random.default_rng(seed)
  return rng, make(rng, (lanes(dtype) + 1, *shape), dtype)
