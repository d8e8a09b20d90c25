"""What the small-matrix kernel tests (tests/test_small_*.py) share: the
layouts the targets take, the sizes and batches every kernel is tried at,
the sizes around a switch point, and where the fixed-size kernels run."""

from __future__ import annotations

import pytest

from batchpart import _core

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
