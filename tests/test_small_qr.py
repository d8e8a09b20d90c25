"""The interleaved small-matrix QR (cc/lapack/small_qr.*) behind batchpart_qr
and batchpart_qr_row_major: Q and R against the per-matrix path and numpy on
both sides of the size switch, partly filled groups, tall and wide shapes,
columns with nothing to annihilate, extreme magnitudes and non-finite
elements beside ordinary ones, for real and complex types, and gradients
through bp.linalg.qr."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from small_tables import LAYOUTS, MARKS, both_paths, call, past_a_group, sizes_around

import batchpart as bp
from batchpart import _core
from batchpart.testing import (
  DTYPES,
  assert_alone_as_in_batch,
  assert_close,
  lanes,
  random_array,
  small_path,
  switch_key,
)

pytestmark = MARKS

# The max(m, n) each layout runs interleaved (kQr*Sizes in
# cc/lapack/small_qr.h), by (row_major, complex, single precision).
SWITCH = _core.lapack.small_qr_sizes()
MODES = pytest.mark.parametrize("full", [False, True], ids=["reduced", "complete"])


def largest(row_major, dtype):
  return SWITCH[(row_major, *switch_key(dtype))][1]


def sizes_around_switch(row_major, dtype):
  return sizes_around(largest(row_major, dtype))


def qr(a, full, row_major):
  *batch, m, n = a.shape
  cols = m if full else min(m, n)
  return call("batchpart_qr", [a], [((*batch, m, cols), a.dtype, True),
                                    ((*batch, cols, n), a.dtype, True)],
              row_major, full_matrices=full)


def check_qr(a, q, r, dtype):
  """Q R = A, Q's columns orthonormal, R upper triangular."""
  m, cols = q.shape[-2:]
  scale = max(1.0, float(np.abs(a).max(initial=0.0))) * max(a.shape[-2:], default=1)
  assert_close(q @ r, a, dtype, scale)
  identity = np.broadcast_to(np.eye(cols), (*q.shape[:-2], cols, cols))
  assert_close(np.conj(np.swapaxes(q, -1, -2)) @ q, identity, dtype, max(m, 1))
  assert not np.tril(r, -1).any()


def check_same_as_per_matrix(a, ours, theirs, dtype):
  """Both paths take LAPACK's reflectors and signs: the same Q and R, to
  rounding (amplified by the matrices' conditioning)."""
  (q, r), (q0, r0) = ours, theirs
  check_qr(a, q, r, dtype)
  n = max(a.shape[-2:])
  assert_close(r, r0, dtype, 100 * max(1.0, float(np.abs(a).max(initial=0.0))) * n)
  assert_close(q, q0, dtype, 100 * n)


@LAYOUTS
@MODES
@pytest.mark.parametrize("dtype", DTYPES)
def test_qr_matches_the_per_matrix_path_on_both_sides_of_the_switch(row_major, full, dtype):
  rng = np.random.default_rng(0)
  for n in sizes_around_switch(row_major, dtype):
    a = random_array(rng, (lanes(dtype) + 3, n, n), dtype)
    with small_path("qr", "auto"):
      auto = qr(a, full, row_major)
    ours, theirs = both_paths("qr", qr, a, full, row_major)
    check_same_as_per_matrix(a, ours, theirs, dtype)
    # "auto" takes the interleaved kernel up to the switch, bit for bit.
    expected = ours if n <= largest(row_major, dtype) else theirs
    for got, want in zip(auto, expected, strict=True):
      np.testing.assert_array_equal(got, want)


@LAYOUTS
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch", [1, 5, 17, 100])
def test_qr_of_batches_that_do_not_fill_the_lanes(row_major, dtype, batch):
  a = random_array(np.random.default_rng(batch), (batch, 7, 7), dtype)
  ours, theirs = both_paths("qr", qr, a, False, row_major)
  check_same_as_per_matrix(a, ours, theirs, dtype)


@LAYOUTS
@MODES
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m, n", [(5, 3), (3, 5), (1, 6), (6, 1), (17, 9), (9, 17), (48, 3),
                                  (3, 48)])
def test_qr_of_tall_and_wide_matrices(row_major, full, dtype, m, n):
  a = random_array(np.random.default_rng(m * n), (11, m, n), dtype)
  ours, theirs = both_paths("qr", qr, a, full, row_major)
  check_same_as_per_matrix(a, ours, theirs, dtype)
  expected = np.linalg.qr(a, mode="complete" if full else "reduced")
  assert_close(ours[1], expected.R, dtype, 100 * max(m, n))


@LAYOUTS
@pytest.mark.parametrize("dtype", DTYPES)
def test_columns_with_nothing_to_annihilate_keep_their_reflector_the_identity(row_major, dtype):
  # An upper triangular matrix: every column is zero below the diagonal, so
  # every tau is 0 (LAPACK's larfg): Q = I and R = A exactly, in groups
  # shared with ordinary matrices.
  # (Complex: with a real diagonal, as zlarfg keeps H = I only for a real
  # alpha.)
  n = 6
  _, a = past_a_group(random_array, dtype, (n, n))
  a[::2] = np.triu(a[::2])
  diagonal = np.arange(n)
  a[::2, diagonal, diagonal] = a[::2, diagonal, diagonal].real
  a[1, :, 2] = 0  # and one zero column in an ordinary matrix
  ours, theirs = both_paths("qr", qr, a, False, row_major)
  q, r = ours
  np.testing.assert_array_equal(q[::2], np.broadcast_to(np.eye(n, dtype=dtype), q[::2].shape))
  np.testing.assert_array_equal(r[::2], a[::2])
  check_same_as_per_matrix(a, ours, theirs, dtype)


@LAYOUTS
@pytest.mark.parametrize("dtype, magnitude", [
    (np.float32, 1e-30), (np.float32, 1e30), (np.float64, 1e-170), (np.float64, 1e170),
    (np.complex64, 1e-30), (np.complex64, 1e30), (np.complex128, 1e-170),
    (np.complex128, 1e170)])
def test_extreme_magnitudes_beside_ordinary_matrices(row_major, dtype, magnitude):
  # Squares of these underflow or overflow (float64: even in double, so the
  # kernel sums those lanes' norms again, rescaled); the ordinary matrices
  # in the same groups must not notice.
  rng = np.random.default_rng(2)
  n = 8
  a = random_array(rng, (2 * lanes(dtype) + 3, n, n), np.complex128 if np.iscomplexobj(
      np.zeros(0, dtype)) else np.float64)
  a[::3] *= magnitude
  a = a.astype(dtype)
  ours, theirs = both_paths("qr", qr, a, False, row_major)
  q, r = ours
  assert np.isfinite(q).all() and np.isfinite(r).all()
  for index in (slice(0, None, 3), [i for i in range(len(a)) if i % 3]):
    check_same_as_per_matrix(a[index], (q[index], r[index]),
                             (theirs[0][index], theirs[1][index]), dtype)


@LAYOUTS
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_elements_stay_in_their_batch_element(row_major, dtype, bad):
  a = random_array(np.random.default_rng(3), (lanes(dtype) + 2, 8, 8), dtype)
  a[1, 4, 1] = bad
  a[lanes(dtype), 0, 0] = bad
  q, r = both_paths("qr", qr, a, False, row_major)[0]
  for i in (1, lanes(dtype)):
    assert not (np.isfinite(q[i]).all() and np.isfinite(r[i]).all())
  ok = [i for i in range(len(a)) if i not in (1, lanes(dtype))]
  check_qr(a[ok], q[ok], r[ok], dtype)


def awkward(rng, m, n, dtype):
  """Six m x n matrices where the QR branches: ordinary, a zero column,
  upper triangular (nothing to annihilate), squares that underflow and that
  overflow (rescaled norms), and a NaN."""
  wide = np.complex128 if np.iscomplexobj(np.zeros(0, dtype)) else np.float64
  a = random_array(rng, (6, m, n), wide)
  a[1, :, n // 2] = 0
  a[2] = np.triu(a[2])
  tiny, huge = (1e-30, 1e30) if np.finfo(dtype).bits == 32 else (1e-170, 1e170)
  a[3] *= tiny
  a[4] *= huge
  a[5, m // 2, n // 2] = np.nan
  return a.astype(dtype)


@LAYOUTS
@settings(max_examples=20, deadline=None)
@given(dtype=st.sampled_from(DTYPES), m=st.integers(1, 57), n=st.integers(1, 57),
       full=st.booleans(), seed=st.integers(0, 2**16))
def test_a_lone_matrix_gets_the_bits_of_its_group(row_major, dtype, m, n, full, seed):
  # A batch of one runs the one-matrix twin, the batch of 6 a group: the same
  # bits where the QR branches, tall and wide, on both sides of the switch.
  a = awkward(np.random.default_rng(seed), m, n, dtype)
  assert_alone_as_in_batch(lambda a: qr(a, full, row_major), (a,), f"{m} x {n}")


@LAYOUTS
@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
def test_a_complex_diagonal_reflects_to_a_real_one(row_major, dtype):
  # Upper triangular with a complex diagonal: zlarfg still reflects each
  # column (tau = 1 - alpha / beta, v = 0 below), so R's diagonal is
  # -sign(re(a_jj)) |a_jj|, real, and Q is diagonal, unitary.
  rng = np.random.default_rng(7)
  n = 5
  a = np.triu(random_array(rng, (lanes(dtype) + 3, n, n), dtype))
  ours, theirs = both_paths("qr", qr, a, False, row_major)
  q, r = ours
  diagonal = np.diagonal(a, axis1=-2, axis2=-1)
  assert_close(np.diagonal(r, axis1=-2, axis2=-1),
               -np.sign(diagonal.real) * np.abs(diagonal), dtype, 4)
  assert not np.diagonal(r, axis1=-2, axis2=-1).imag.any()
  assert not (q - np.diagonal(q, axis1=-2, axis2=-1)[..., None] * np.eye(n)).any()
  check_same_as_per_matrix(a, ours, theirs, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_linalg_qr_and_its_gradient_through_the_interleaved_path(dtype):
  a = jnp.asarray(past_a_group(random_array, dtype, (6, 4), seed=5)[1])
  loss = lambda f: lambda a: sum(jnp.sum(jnp.real(jnp.sin(x))) for x in f(a))
  for mode in ("reduced", "complete"):
    q, r = bp.linalg.qr(a, mode=mode)
    check_qr(np.asarray(a), np.asarray(q), np.asarray(r), dtype)
  grad = jax.grad(loss(lambda a: bp.linalg.qr(a)))(a)
  expected = jax.grad(loss(lambda a: jnp.linalg.qr(a)))(a)
  assert_close(np.asarray(grad), np.asarray(expected), dtype, 100)


def test_always_runs_the_interleaved_qr_above_its_switch_point():
  # Past the switch point, and past the 64 reflectors the kernel keeps on
  # its stack (it takes the heap beyond).
  n = max(largest(True, np.float64), 64) + 8
  a = random_array(np.random.default_rng(6), (3, n, n), np.float64)
  ours, theirs = both_paths("qr", qr, a, False, True)
  check_same_as_per_matrix(a, ours, theirs, np.float64)
  assert any((x != y).any() for x, y in zip(ours, theirs, strict=True))
