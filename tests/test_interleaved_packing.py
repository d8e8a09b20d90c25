"""What the small-matrix kernels share (cc/lapack/interleaved.*): the block
transposes that pack and unpack their groups, where each instruction set this
CPU has gives results bit for bit equal to element-by-element packing (every
kernel that packs, every dtype and layout, sizes that are and are not
multiples of the lanes, batches that end in a part-filled group, which packs
element by element in every mode); and the one switch of their paths."""

from __future__ import annotations

import contextlib

import jax
import numpy as np
import pytest

import batchpart as bp
from batchpart import _core, _lapack_targets
from batchpart._lapack_targets import column_major
from batchpart.testing import hermitian_pd, lanes, random_array, small_path

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("x64")]

DTYPES = [np.float32, np.float64, np.complex64, np.complex128]
ORDER = ["none", "avx2", "avx512"]
SUPPORTED = ORDER[: ORDER.index(_core.lapack.supported_block_transposes()) + 1]
SIZES = [1, 3, 4, 5, 8, 12, 16, 17]


@pytest.fixture(scope="module", autouse=True)
def _registered():
  _lapack_targets.register()


@contextlib.contextmanager
def block_transposes(limit):
  before = _core.lapack.block_transposes()
  _core.lapack.set_block_transposes(limit)
  try:
    yield
  finally:
    _core.lapack.set_block_transposes("avx512" if before != "none" else before)


def column_major_call(target, operands, results, **attributes):
  """`target` on column-major operands; results as numpy arrays."""
  f = jax.ffi.ffi_call(
      target, [jax.ShapeDtypeStruct(s, d) for s, d, _ in results],
      input_layouts=[column_major(np.shape(x)) for x in operands],
      output_layouts=[column_major(s) if matrix else None for s, _, matrix in results])
  return f(*operands, **attributes)


def kernels(batch, n, dtype):
  """name -> (function of no arguments, returning arrays): every kernel that packs groups."""
  rng = np.random.default_rng(n)
  spd = hermitian_pd(rng, (batch,), n, dtype)
  general = random_array(rng, (batch, n, n), dtype)
  rhs = random_array(rng, (batch, n, 3), dtype)
  tri = np.tril(general) + 4 * n * np.eye(n, dtype=dtype)
  i32 = np.int32
  return {
      "potrf column-major": lambda: column_major_call(
          "batchpart_potrf", [spd], [(spd.shape, dtype, True), ((batch,), i32, False)],
          lower=True, symmetrize=False),
      "cholesky row-major": lambda: bp.linalg.cholesky(spd),
      "posv column-major": lambda: column_major_call(
          "batchpart_posv", [spd, rhs], [(rhs.shape, dtype, True), ((batch,), i32, False)],
          lower=True),
      "getrf column-major": lambda: column_major_call(
          "batchpart_getrf", [general],
          [(general.shape, dtype, True), ((batch, n), i32, False), ((batch, n), i32, False),
           ((batch,), i32, False)]),
      "lu row-major": lambda: bp.linalg.lu(general),
      "gesv column-major": lambda: column_major_call(
          "batchpart_gesv", [general, rhs], [(rhs.shape, dtype, True), ((batch,), i32, False)]),
      "solve row-major": lambda: bp.linalg.solve(general, rhs),
      "triangular_solve left": lambda: bp.linalg.triangular_solve(
          tri, rhs, left_side=True, lower=True),
      "triangular_solve right, transposed": lambda: bp.linalg.triangular_solve(
          tri, np.swapaxes(rhs, -1, -2), left_side=False, lower=True, transpose_a=True),
  }


def assert_same_bits_as_element_loops(run, limit, what):
  """run()'s arrays with block transposes up to `limit` equal those of the element loops."""
  with block_transposes("none"):
    expected = jax.tree.map(np.asarray, run())
  with block_transposes(limit):
    got = jax.tree.map(np.asarray, run())
  for e, g in zip(jax.tree.leaves(expected), jax.tree.leaves(got), strict=True):
    np.testing.assert_array_equal(g, e, err_msg=f"{what}, limit {limit}")


@pytest.mark.parametrize("limit", SUPPORTED[1:] or ["none"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_block_transposes_give_the_element_loops_results_bit_for_bit(limit, dtype):
  for n in SIZES:
    for name, run in kernels(2 * lanes(dtype) + 3, n, dtype).items():
      assert_same_bits_as_element_loops(run, limit, f"{name}, n = {n}")


@pytest.mark.parametrize("n", [32, 64])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_matrices_a_page_apart_unpack_as_the_element_loops(dtype, n):
  # 32 x 32 and 64 x 64 float32 matrices (complex64 too) lie a multiple of
  # 4 KiB apart, so a block's lines fall in one cache set for every lane;
  # such groups unpack half their lanes at a time.
  with contextlib.ExitStack() as paths:
    for kernel in ("cholesky", "triangular_solve", "lu"):
      paths.enter_context(small_path(kernel, "always"))
    for name, run in kernels(lanes(dtype) + 3, n, dtype).items():
      assert_same_bits_as_element_loops(run, SUPPORTED[-1], f"{name}, n = {n}")


def test_the_limit_caps_what_the_cpu_supports():
  with block_transposes("none"):
    assert _core.lapack.block_transposes() == "none"
  with block_transposes("avx2"):
    assert _core.lapack.block_transposes() == SUPPORTED[min(1, len(SUPPORTED) - 1)]
  assert _core.lapack.block_transposes() == SUPPORTED[-1]


def test_an_unknown_limit_is_refused_by_name():
  with pytest.raises(ValueError, match="set_block_transposes.*'avx3'"):
    _core.lapack.set_block_transposes("avx3")
  assert _core.lapack.block_transposes() == SUPPORTED[-1]


KERNELS = ["cholesky", "triangular_solve", "lu", "qr", "eigh"]


@pytest.mark.parametrize("kernel", KERNELS)
def test_small_path_round_trips_and_rejects_unknown_names(kernel):
  assert _core.lapack.small_path(kernel) == "auto"
  for path in ("never", "always", "auto"):
    _core.lapack.set_small_path(kernel, path)
    assert _core.lapack.small_path(kernel) == path
  with pytest.raises(ValueError, match="path must be one of 'auto', 'always', 'never', not 'some'"):
    _core.lapack.set_small_path(kernel, "some")
  assert _core.lapack.small_path(kernel) == "auto"
  with pytest.raises(ValueError, match="kernel must be one of 'cholesky', .*, not 'svd'"):
    _core.lapack.set_small_path("svd", "never")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_always_runs_the_interleaved_kernels_above_their_switch_points(dtype):
  # n = 40 and a batch of 3: beyond every automatic switch point of potrf,
  # posv, getrf and gesv (n and, for Cholesky, the batch), so only "always"
  # takes the interleaved kernels; they agree with the per-matrix path.
  rng = np.random.default_rng(1)
  n, batch = 40, 3
  spd = hermitian_pd(rng, (batch,), n, dtype)
  general = random_array(rng, (batch, n, n), dtype) + 2 * np.sqrt(n) * np.eye(n, dtype=dtype)
  rhs = random_array(rng, (batch, n, 2), dtype)
  tol = 1e-4 if np.finfo(dtype).bits == 32 else 1e-10
  runs = {
      "cholesky": lambda: (bp.linalg.cholesky(spd), bp.linalg.solve(spd, rhs, assume_a="pos")),
      "lu": lambda: (bp.linalg.lu(general)[0], bp.linalg.solve(general, rhs)),
  }
  for kernel, run in runs.items():
    results = {}
    for path in ("never", "always"):
      with small_path(kernel, path):
        results[path] = [np.asarray(x) for x in run()]
    for got, expected in zip(results["always"], results["never"], strict=True):
      np.testing.assert_allclose(got, expected, rtol=tol, atol=tol * np.abs(expected).max())
