"""The batch-interleaved small triangular solve (cc/lapack/small_triangular_solve.cc)
behind batchpart_trsm and batchpart_trsm_row_major: every dtype and flag
against NumPy on both sides of its size switch, odd batch sizes, broadcast
operands, several right-hand sides, non-finite input, and agreement with the
BLAS path it replaces.

The targets are called through ``jax.ffi.ffi_call`` with explicit layouts, so
that both the column-major and the row-major target are exercised;
``_core.lapack.set_small_path("triangular_solve", ...)`` forces either path.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import scipy.linalg
from hypothesis import given, settings, strategies as st
from small_tables import LAYOUTS, MARKS, call

from batchpart import _core
from batchpart.testing import (
  DTYPES,
  assert_alone_as_in_batch,
  random_array,
  small_path,
  switch_key,
)

pytestmark = MARKS

# The largest triangle each dtype solves interleaved, by (complex, single precision).
SWITCHES = _core.lapack.small_trsm_max_sizes()
FLAGS = list(itertools.product([False, True], repeat=5))


def switch(dtype):
  return SWITCHES[switch_key(dtype)]


def flag_id(flags):
  return "".join("LlTCU"[i] if v else "-" for i, v in enumerate(flags))


def trsm(a, b, flags, *, row_major):
  left_side, lower, transpose_a, conjugate_a, unit_diagonal = flags
  shape = (*np.broadcast_shapes(a.shape[:-2], b.shape[:-2]), *b.shape[-2:])
  (x,) = call("batchpart_trsm", [a, b], [(shape, b.dtype, True)], row_major,
              left_side=left_side, lower=lower, transpose_a=transpose_a,
              conjugate_a=conjugate_a, unit_diagonal=unit_diagonal)
  return x


def triangular(rng, shape, dtype, lower):
  """A random triangle, NaN in the triangle the solve must not read. Off the
  diagonal entries of size 1/sqrt(n) keep unit-diagonal triangles from being
  hopelessly ill conditioned at n = 32."""
  n = shape[-1]
  a = (random_array(rng, shape, dtype) / np.sqrt(max(n, 1)) + 2 * np.eye(n)).astype(dtype)
  unread = np.triu(np.ones((n, n), bool), 1) if lower else np.tril(np.ones((n, n), bool), -1)
  return np.where(unread, np.asarray(np.nan, dtype), a)


def operator(a, flags):
  """op(A) as the solve sees it, in double precision: A's triangle, ones on
  the diagonal when unit, transposed and conjugated as asked."""
  _, lower, transpose_a, conjugate_a, unit_diagonal = flags
  n = a.shape[-1]
  wide = np.complex128 if np.iscomplexobj(a) else np.float64
  tri = np.tril(a) if lower else np.triu(a)
  tri = np.nan_to_num(tri.astype(wide), nan=0.0)
  if unit_diagonal:
    tri = tri * (1 - np.eye(n)) + np.eye(n)
  op = np.swapaxes(tri, -1, -2) if transpose_a else tri
  return np.conj(op) if conjugate_a else op


def reference(a, b, flags):
  """x solving op(A) x = b (left) or x op(A) = b, by scipy on each matrix."""
  left_side, lower, transpose_a, conjugate_a, unit_diagonal = flags
  batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
  op = np.broadcast_to(operator(a, flags), (*batch, *a.shape[-2:]))
  rhs = np.broadcast_to(b.astype(op.dtype), (*batch, *b.shape[-2:]))
  x = np.empty(rhs.shape, op.dtype)
  op_lower = lower != transpose_a
  for i in np.ndindex(*batch):
    if left_side:
      x[i] = scipy.linalg.solve_triangular(op[i], rhs[i], lower=op_lower)
    else:  # x op = b  <=>  op^T x^T = b^T
      x[i] = scipy.linalg.solve_triangular(op[i].T, rhs[i].T, lower=not op_lower).T
  return x, op


def assert_solves(x, a, b, flags):
  """x is the solution to the accuracy of a backward-stable solve: each
  matrix's error relative to its solution within a few n eps cond(op(A))."""
  expected, op = reference(a, b, flags)
  assert x.shape == expected.shape
  n = a.shape[-1]
  eps = np.finfo(x.dtype).eps
  batch = expected.shape[:-2]
  op = np.broadcast_to(op, (*batch, n, n))
  for i in np.ndindex(*batch):
    cond = np.linalg.cond(op[i]) if n else 1.0
    scale = max(np.max(np.abs(expected[i]), initial=0.0), np.finfo(x.dtype).tiny)
    error = np.max(np.abs(x[i] - expected[i]), initial=0.0) / scale
    assert error <= 8 * max(n, 1) * eps * cond, (i, error, cond)


def rhs_shape(batch, n, k, left_side):
  return (*batch, n, k) if left_side else (*batch, k, n)


# ---- every dtype and flag ---------------------------------------------------------


@LAYOUTS
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("flags", FLAGS, ids=flag_id)
def test_every_flag_matches_scipy_on_both_sides_of_the_switch(row_major, dtype, flags):
  rng = np.random.default_rng(abs(hash((row_major, flags))) % 2**32)
  for n in (1, 2, 7, 16, switch(dtype), switch(dtype) + 1):
    a = triangular(rng, (17, n, n), dtype, flags[1])
    b = random_array(rng, rhs_shape((17,), n, 3, flags[0]), dtype)
    assert_solves(trsm(a, b, flags, row_major=row_major), a, b, flags)


# ---- sizes, batches and right-hand sides, in the interleaved kernel -----------------


@LAYOUTS
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", sorted({1, 2, 3, 7, 8, 16, 31, 32, *SWITCHES.values(),
                                      *(s + 1 for s in SWITCHES.values())}))
def test_sizes_and_batches_not_a_multiple_of_the_lanes(row_major, dtype, n):
  rng = np.random.default_rng(n)
  with small_path("triangular_solve", "always"):
    for batch, k, flags in [(1, 1, FLAGS[31]), (5, 4, FLAGS[20]), (17, 1, FLAGS[9]),
                            (100, 2, FLAGS[26])]:
      a = triangular(rng, (batch, n, n), dtype, flags[1])
      b = random_array(rng, rhs_shape((batch,), n, k, flags[0]), dtype)
      assert_solves(trsm(a, b, flags, row_major=row_major), a, b, flags)


@LAYOUTS
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", [1, 3, 4, 5, 9])
def test_right_hand_side_counts(row_major, dtype, k):
  # 4 right-hand sides make one register block; 1, 3, 5, 9 leave remainders.
  rng = np.random.default_rng(k)
  with small_path("triangular_solve", "always"):
    for flags in [(True, True, False, False, False), (False, False, True, True, False)]:
      a = triangular(rng, (19, 6, 6), dtype, flags[1])
      b = random_array(rng, rhs_shape((19,), 6, k, flags[0]), dtype)
      assert_solves(trsm(a, b, flags, row_major=row_major), a, b, flags)


@LAYOUTS
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ["auto", "always"])
def test_broadcast_batches(row_major, dtype, mode):
  rng = np.random.default_rng(7)
  flags = (True, True, False, False, False)
  with small_path("triangular_solve", mode):
    # a broadcast over b's leading dim, b over a's trailing one, and a single
    # a for the whole batch.
    for a_batch, b_batch in [((1, 9), (3, 9)), ((3, 9), (3, 1)), ((), (21,)), ((21,), ())]:
      a = triangular(rng, (*a_batch, 5, 5), dtype, True)
      b = random_array(rng, (*b_batch, 5, 2), dtype)
      x = trsm(a, b, flags, row_major=row_major)
      assert x.shape == (*np.broadcast_shapes(a_batch, b_batch), 5, 2)
      assert_solves(x, a, b, flags)


# ---- the switch --------------------------------------------------------------------


@LAYOUTS
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("offset", [-1, 0, 1])
@pytest.mark.parametrize("batch", [1, 3, 8, 33])
def test_interleaved_and_blas_paths_agree(row_major, dtype, offset, batch):
  n = switch(dtype) + offset
  rng = np.random.default_rng(n * 100 + batch)
  eps = np.finfo(dtype).eps
  for flags in [FLAGS[0], FLAGS[13], FLAGS[22], FLAGS[31]]:
    a = triangular(rng, (batch, n, n), dtype, flags[1])
    b = random_array(rng, rhs_shape((batch,), n, 2, flags[0]), dtype)
    results = {}
    for mode in ("auto", "always", "never"):
      with small_path("triangular_solve", mode):
        results[mode] = trsm(a, b, flags, row_major=row_major)
    _, op = reference(a, b, flags)
    cond = max(np.linalg.cond(m) for m in op)
    scale = np.max(np.abs(results["never"]))
    for mode in ("auto", "always"):
      difference = np.max(np.abs(results[mode] - results["never"])) / scale
      assert difference <= 16 * n * eps * cond, (mode, difference, cond)


# ---- non-finite input ----------------------------------------------------------------


def nonfinite_inputs(rng, dtype, n, flags):
  """A batch of 9 solves with NaN or Inf where the solve reads them, one
  kind per matrix: in b, in A's triangle, on A's diagonal, or a zero
  diagonal (which gives Inf and NaN, as BLAS's trsm does)."""
  a = triangular(rng, (9, n, n), dtype, flags[1])
  b = random_array(rng, rhs_shape((9,), n, 2, flags[0]), dtype)
  off = (n - 1, 0) if flags[1] else (0, n - 1)
  b[0].flat[3] = np.nan
  b[1].flat[0] = np.inf
  a[2][off] = np.nan
  a[3][off] = np.inf
  a[4][n // 2, n // 2] = 0
  a[5][n // 2, n // 2] = np.nan
  a[6][n // 2, n // 2] = np.inf
  b[7][...] = 0
  a[7][n // 2, n // 2] = 0
  return a, b


@LAYOUTS
@settings(max_examples=20, deadline=None)
@given(dtype=st.sampled_from(DTYPES), flags=st.sampled_from(FLAGS), n=st.integers(2, 33),
       seed=st.integers(0, 2**16))
def test_a_lone_matrix_gets_the_bits_of_its_group(row_major, dtype, flags, n, seed):
  # A batch of one runs the one-matrix twin, the batch of 9 a group: the same
  # bits on ordinary, NaN, infinite and zero-diagonal solves.
  a, b = nonfinite_inputs(np.random.default_rng(seed), dtype, n, flags)
  assert_alone_as_in_batch(lambda a, b: trsm(a, b, flags, row_major=row_major), (a, b),
                           f"n = {n}, {flag_id(flags)}")


@LAYOUTS
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("flags", [FLAGS[0], FLAGS[13], FLAGS[22], FLAGS[27], FLAGS[31]],
                         ids=flag_id)
def test_nonfinite_input_propagates_as_blas_does(row_major, dtype, flags):
  rng = np.random.default_rng(3)
  n = 6
  a, b = nonfinite_inputs(rng, dtype, n, flags)
  with small_path("triangular_solve", "never"):
    blas = trsm(a, b, flags, row_major=row_major)
  with small_path("triangular_solve", "always"):
    small = trsm(a, b, flags, row_major=row_major)
  # Non-finite exactly where BLAS's is. Real: NaN where BLAS's is NaN for
  # the NaN inputs (matrices 0, 2 and 5), which any order of the arithmetic
  # carries to every element that reads them. From an Inf or a zero
  # diagonal, whether an element meets Inf - Inf depends on the order of
  # the additions, which differs between BLAS builds (OpenBLAS picks its
  # kernels per CPU: on an AMD Zen 5 its float32 solve made NaN where the
  # small kernel's substitution keeps Inf), so there only finiteness is
  # compared. Complex Inf arithmetic makes NaN parts by the way it is
  # spelled (OpenBLAS multiplies by a unit diagonal's stored 1 + 0i: Inf
  # becomes Inf + NaN i), so complex compares finiteness only.
  np.testing.assert_array_equal(np.isfinite(small), np.isfinite(blas))
  if not np.iscomplexobj(blas):
    nan_inputs = [0, 2, 5]
    np.testing.assert_array_equal(np.isnan(small[nan_inputs]), np.isnan(blas[nan_inputs]))
  finite = np.isfinite(blas)
  np.testing.assert_allclose(small[finite], blas[finite], rtol=1e-3, atol=1e-3)
  # The matrix with nothing non-finite (the last) is solved as usual.
  assert np.all(np.isfinite(small[8]))


@LAYOUTS
@pytest.mark.parametrize("dtype", DTYPES)
def test_unread_entries_are_not_read(row_major, dtype):
  # NaN in the other triangle and, with a unit diagonal, on the diagonal.
  rng = np.random.default_rng(11)
  for flags in [(True, True, False, False, True), (False, False, True, True, True)]:
    a = triangular(rng, (10, 5, 5), dtype, flags[1])
    a[:, np.arange(5), np.arange(5)] = np.nan
    b = random_array(rng, rhs_shape((10,), 5, 2, flags[0]), dtype)
    with small_path("triangular_solve", "always"):
      x = trsm(a, b, flags, row_major=row_major)
    assert np.all(np.isfinite(x))
    assert_solves(x, a, b, flags)
