"""The interleaved small-matrix LU and solve (cc/lapack/small_lu.*) behind
batchpart_getrf and batchpart_gesv and their row-major twins: values against
scipy and numpy, LAPACK's pivot choices, singular and non-finite elements,
broadcasting, and the same pivots, permutation and info as the per-matrix
path on both sides of the size switch."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg
from hypothesis import HealthCheck, given, settings, strategies as st
from small_tables import BATCHES, FIXED_SIZE, LAYOUTS, MARKS, MAX_FIXED, call, sizes_around

import batchpart as bp
from batchpart import _core
from batchpart.testing import (
  DTYPES,
  TOL,
  assert_alone_as_in_batch,
  assert_close,
  generic_kernels,
  lanes,
  random_array,
  small_path,
)

pytestmark = MARKS

# The sizes each target runs interleaved (k*Sizes in cc/lapack/small_lu.h),
# by (target, row_major, single precision).
SWITCH = _core.lapack.small_lu_sizes()


def sizes_around_switch(target, row_major, dtype):
  low, high = SWITCH[target, row_major, np.finfo(dtype).bits == 32]
  return sizes_around(high, low)


def batches_around_switch(target, row_major, dtype, seed: int, make=None):
  """(rng, a) for each size around ``target``'s switch: ``a`` 17 n x n
  matrices drawn by ``make`` (default ``random_array``) from ``rng``, which
  the caller may draw more from."""
  rng = np.random.default_rng(seed)
  for n in sizes_around_switch(target, row_major, dtype):
    yield rng, (make or random_array)(rng, (17, n, n), dtype)


def getrf(a, row_major):
  *batch, m, n = a.shape
  return call("batchpart_getrf", [a],
              [(a.shape, a.dtype, True), ((*batch, min(m, n)), np.int32, False),
               ((*batch, m), np.int32, False), (tuple(batch), np.int32, False)], row_major)


def gesv(a, b, row_major):
  batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
  return call("batchpart_gesv", [a, b],
              [((*batch, *b.shape[-2:]), b.dtype, True), (tuple(batch), np.int32, False)],
              row_major)


def scale_of(a):
  return max(1.0, float(np.max(np.abs(a), initial=0.0))) * a.shape[-1]


def check_against_scipy(a, lu, pivots, perm, info):
  """A[perm] = L U, scipy's pivots and a matching permutation, no failure."""
  *batch, m, n = a.shape
  k = min(m, n)
  assert not info.any()
  lower = np.tril(lu[..., :, :k], -1) + np.eye(m, k, dtype=lu.dtype)
  upper = np.triu(lu[..., :k, :])
  permuted = np.take_along_axis(a, perm[..., :, None].astype(np.int64), axis=-2)
  assert_close(lower @ upper, permuted, a.dtype.type, scale_of(a))
  for index in np.ndindex(*batch):
    # Pivots computed in complex128: the choice exact arithmetic makes.
    _, expected = scipy.linalg.lu_factor(a[index].astype(np.complex128))
    assert list(pivots[index]) == list(expected), index
    order = np.arange(m)
    for i, p in enumerate(expected):
      order[[i, p]] = order[[p, i]]
    assert list(perm[index]) == list(order), index


def well_conditioned(rng, shape, dtype):
  n = shape[-1]
  return (random_array(rng, shape, dtype) + 2 * np.sqrt(n) * np.eye(n)).astype(dtype)


# ---- values -------------------------------------------------------------------------


@LAYOUTS
@pytest.mark.parametrize("dtype", DTYPES)
def test_lu_matches_scipy_on_both_sides_of_the_switch(row_major, dtype):
  for _, a in batches_around_switch("getrf", row_major, dtype, 0):
    check_against_scipy(a, *getrf(a, row_major))


@LAYOUTS
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch", BATCHES)
def test_lu_of_batches_that_do_not_fill_the_lanes(row_major, dtype, batch):
  a = random_array(np.random.default_rng(batch), (batch, 7, 7), dtype)
  check_against_scipy(a, *getrf(a, row_major))


@LAYOUTS
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m, n", [(5, 3), (3, 5), (1, 6), (6, 1), (16, 9), (9, 16)])
def test_lu_of_non_square_matrices(row_major, dtype, m, n):
  a = random_array(np.random.default_rng(m * n), (11, m, n), dtype)
  check_against_scipy(a, *getrf(a, row_major))


@LAYOUTS
@pytest.mark.parametrize("dtype", DTYPES)
def test_solve_matches_numpy_on_both_sides_of_the_switch(row_major, dtype):
  for rng, a in batches_around_switch("gesv", row_major, dtype, 1, well_conditioned):
    n = a.shape[-1]
    b = random_array(rng, (17, n, 3), dtype)
    x, info = gesv(a, b, row_major)
    assert not info.any()
    assert_close(x, np.linalg.solve(a, b), dtype, n)


@LAYOUTS
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("nrhs", [1, 4])
def test_solve_of_batches_that_do_not_fill_the_lanes(row_major, dtype, batch, nrhs):
  rng = np.random.default_rng(batch + nrhs)
  a = well_conditioned(rng, (batch, 8, 8), dtype)
  b = random_array(rng, (batch, 8, nrhs), dtype)
  x, info = gesv(a, b, row_major)
  assert not info.any()
  assert_close(x, np.linalg.solve(a, b), dtype, 8)


@LAYOUTS
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("a_batch, b_batch", [
    ((5, 1), (1, 3)),  # each A against several B, each B against several A
    ((), (17,)),       # one A for every element
    ((17,), ()),       # one B for every element
    ((2, 9), (9,)),
])
def test_solve_broadcasts_a_and_b(row_major, dtype, a_batch, b_batch):
  rng = np.random.default_rng(len(a_batch) + 2 * len(b_batch))
  a = well_conditioned(rng, (*a_batch, 6, 6), dtype)
  b = random_array(rng, (*b_batch, 6, 2), dtype)
  x, info = gesv(a, b, row_major)
  expected = np.linalg.solve(a, b)
  assert x.shape == expected.shape and not info.any()
  assert_close(x, expected, dtype, 6)


# ---- LAPACK's choices ---------------------------------------------------------------


@LAYOUTS
@pytest.mark.parametrize("dtype", DTYPES)
def test_ties_in_pivot_magnitude_take_the_first_row(row_major, dtype):
  rng = np.random.default_rng(2)
  a = random_array(rng, (17, 6, 6), dtype)
  if np.issubdtype(dtype, np.complexfloating):
    # Equal in |re| + |im| (i?amax's magnitude), not in modulus: -3 is the
    # largest by modulus and must not win.
    ties = np.array([1 + 2j, 2 + 1j, -3, 3j, -1 - 2j, -2 + 1j])
  else:
    ties = np.array([1.5, -1.5, 1.5, -1.5, 1.5, -1.5])
  a[..., 0] = rng.permuted(np.broadcast_to(ties, (17, 6)), axis=-1)
  lu, pivots, perm, info = getrf(a, row_major)
  assert (pivots[:, 0] == 0).all()
  check_against_scipy(a, lu, pivots, perm, info)


@LAYOUTS
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [3, 8, 20])
def test_singular_elements_report_info_and_leave_the_others_alone(row_major, dtype, n):
  rng = np.random.default_rng(n)
  a = well_conditioned(rng, (17, n, n), dtype)
  b = random_array(rng, (17, n, 2), dtype)
  a[3, :, n - 1] = 0      # last column zero: info n
  a[9, :, n // 2] = 0     # a zero column in the middle: info n // 2 + 1
  a[16, :, 0] = 0         # the padding lanes' group: info 1
  singular = {3: n, 9: n // 2 + 1, 16: 1}
  lu, pivots, perm, info = getrf(a, row_major)
  x, x_info = gesv(a, b, row_major)
  ok = [i for i in range(17) if i not in singular]
  for i, expected in singular.items():
    assert info[i] == expected and x_info[i] == expected
    assert np.isnan(x[i]).all()
    assert np.isfinite(lu[i]).all()
  assert not info[ok].any() and not x_info[ok].any()
  check_against_scipy(a[ok], lu[ok], pivots[ok], perm[ok], info[ok])
  assert_close(x[ok], np.linalg.solve(a[ok], b[ok]), dtype, n)


@LAYOUTS
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_zero_pivot_after_elimination(row_major, dtype):
  # Exact in floating point. First: row 1 is twice row 0, so after two
  # steps U[2, 2] is exactly zero. Last: step 1 leaves column 1 exactly zero
  # below row 0.
  a = np.stack([np.array([[1, 2, 3], [2, 4, 6], [1, 0, 1]], dtype), 3 * np.eye(3, dtype=dtype),
                np.array([[4, 2, 1], [2, 1, 3], [0, 0, 5]], dtype)])
  _, pivots, _, info = getrf(a, row_major)
  assert list(info) == [3, 0, 2]
  _, x_info = gesv(a, np.ones((3, 3, 1), dtype), row_major)
  assert list(x_info) == [3, 0, 2]
  with small_path("lu", "never"):
    _, expected_pivots, _, expected_info = getrf(a, row_major)
  np.testing.assert_array_equal(pivots, expected_pivots)
  np.testing.assert_array_equal(info, expected_info)


@LAYOUTS
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_elements_stay_in_their_batch_element(row_major, dtype, bad):
  rng = np.random.default_rng(3)
  a = well_conditioned(rng, (17, 8, 8), dtype)
  b = random_array(rng, (17, 8, 1), dtype)
  a[2, 0, 0] = bad
  a[5, 4, 6] = bad
  b[7, 3, 0] = bad
  lu, pivots, perm, info = getrf(a, row_major)
  x, _ = gesv(a, b, row_major)
  ok = [i for i in range(17) if i not in (2, 5, 7)]
  check_against_scipy(a[ok], lu[ok], pivots[ok], perm[ok], info[ok])
  assert_close(x[ok], np.linalg.solve(a[ok], b[ok]), dtype, 8)
  assert not np.isfinite(x[7]).all()
  if np.isnan(bad):
    assert not np.isfinite(x[[2, 5]]).any(axis=(-1, -2)).any()
  if row_major and not np.issubdtype(dtype, np.complexfloating):
    # The per-matrix row-major LU runs the same arithmetic: the same choices
    # on non-finite input, and the same finite entries where an infinite
    # entry of A leaves some. (LAPACK's getrf picks a NaN pivot where
    # getf2's comparisons skip it, and std::complex's products recover
    # infinities that the plain formula makes NaN: garbage either way.)
    with small_path("lu", "never"):
      _, expected_pivots, _, expected_info = getrf(a, row_major)
      x0, _ = gesv(a, b, row_major)
    np.testing.assert_array_equal(pivots, expected_pivots)
    np.testing.assert_array_equal(info, expected_info)
    np.testing.assert_array_equal(np.isfinite(x), np.isfinite(x0))


@LAYOUTS
@pytest.mark.parametrize("dtype", DTYPES)
def test_subnormal_elements_are_singular_and_leave_the_others_alone(row_major, dtype):
  # XLA's CPU threads flush subnormal numbers to zero, so a matrix scaled
  # below the smallest normal number has a zero pivot column (info = 1) on
  # both paths, while the ordinary matrices sharing its groups factor as
  # they would alone.
  rng = np.random.default_rng(5)
  n = 6
  a = well_conditioned(rng, (2 * lanes(dtype) + 3, n, n), dtype)
  a[::3] *= np.finfo(dtype).tiny / 16
  lu, pivots, perm, info = getrf(a, row_major)
  with small_path("lu", "never"):
    _, pivots0, _, info0 = getrf(a, row_major)
  np.testing.assert_array_equal(pivots, pivots0)
  np.testing.assert_array_equal(info, info0)
  assert (info[::3] == 1).all()
  normal = np.ones(len(a), bool)
  normal[::3] = False
  check_against_scipy(a[normal], lu[normal], pivots[normal], perm[normal], info[normal])


# ---- against the per-matrix path ----------------------------------------------------


@LAYOUTS
@pytest.mark.parametrize("dtype", DTYPES)
def test_both_paths_make_the_same_choices_around_the_switch(row_major, dtype):
  rng = np.random.default_rng(4)
  sizes = {*sizes_around_switch("getrf", row_major, dtype),
           *sizes_around_switch("gesv", row_major, dtype)}
  for n in sorted(sizes):
    a = random_array(rng, (lanes(dtype) + 3, n, n), dtype)
    a[1, :, n // 2] = 0
    b = random_array(rng, (lanes(dtype) + 3, n, 2), dtype)
    results = {}
    for enabled in (True, False):
      with small_path("lu", "auto" if enabled else "never"):
        results[enabled] = (*getrf(a, row_major), *gesv(a, b, row_major))
    (lu, piv, perm, info, x, x_info), (lu0, piv0, perm0, info0, x0, x_info0) = (
        results[True], results[False])
    np.testing.assert_array_equal(piv, piv0)
    np.testing.assert_array_equal(perm, perm0)
    np.testing.assert_array_equal(info, info0)
    np.testing.assert_array_equal(x_info, x_info0)
    assert_close(lu, lu0, dtype, scale_of(a))
    ok = ~np.isnan(x0).any(axis=(-1, -2))
    assert np.isnan(x[~ok]).all()
    np.testing.assert_allclose(x[ok], x0[ok], rtol=TOL[dtype] * 100, atol=TOL[dtype] * 100)


# ---- the fixed-size kernels (cc/lapack/small_lu_fixed.*) -----------------------------


def troubled(rng, batch, n, dtype, kinds):
  """Random matrices with, per batch element, kinds[i] of: 0 none, 1 a zero
  column, 2 a NaN, 3 an infinity, 4 a column scaled below the smallest
  normal number (a tiny pivot, or zero where XLA flushes it), 5 small
  integers (ties in pivot magnitude, exact zero pivots after elimination)."""
  a = random_array(rng, (batch, n, n), dtype)
  tiny = np.finfo(dtype).tiny
  for i, kind in enumerate(kinds):
    j = int(rng.integers(n))
    if kind == 1:
      a[i, :, j] = 0
    elif kind == 2:
      a[i, int(rng.integers(n)), j] = np.nan
    elif kind == 3:
      a[i, int(rng.integers(n)), j] = -np.inf
    elif kind == 4:
      a[i, :, j] *= tiny / 4
    elif kind == 5:
      a[i] = rng.integers(-2, 3, (n, n))
  return a


@FIXED_SIZE
@LAYOUTS
@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, MAX_FIXED + 1), single=st.booleans(),
       kinds=st.lists(st.integers(0, 5), min_size=1, max_size=40), seed=st.integers(0, 2**16))
def test_fixed_size_kernels_give_the_generic_kernels_bits(row_major, n, single, kinds, seed):
  dtype = np.float32 if single else np.float64
  rng = np.random.default_rng(seed)
  a = troubled(rng, len(kinds), n, dtype, kinds)
  b = random_array(rng, (len(kinds), n, 1 + seed % 3), dtype)
  with small_path("lu", "always"):
    got = (*getrf(a, row_major), *gesv(a, b, row_major))
    with generic_kernels():
      expected = (*getrf(a, row_major), *gesv(a, b, row_major))
  for name, g, e in zip(("lu", "pivots", "perm", "info", "x", "x info"), got, expected,
                        strict=True):
    np.testing.assert_array_equal(g, e, err_msg=f"{name}, n = {n}")


@LAYOUTS
@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 57), dtype=st.sampled_from(DTYPES),
       kinds=st.lists(st.integers(0, 5), min_size=2, max_size=5), seed=st.integers(0, 2**16))
def test_a_lone_matrix_gets_the_bits_of_its_group(row_major, n, dtype, kinds, seed):
  # A batch of one runs the one-matrix twins, a batch of several a group:
  # the same bits where their code branches (zero columns, NaN, infinities,
  # tiny pivots, ties), on both sides of the switch.
  rng = np.random.default_rng(seed)
  a = troubled(rng, len(kinds), n, dtype, kinds)
  b = random_array(rng, (len(kinds), n, 1 + seed % 3), dtype)
  assert_alone_as_in_batch(lambda a: getrf(a, row_major), (a,), f"getrf n = {n}")
  assert_alone_as_in_batch(lambda a, b: gesv(a, b, row_major), (a, b), f"gesv n = {n}")


@FIXED_SIZE
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", range(1, MAX_FIXED + 2))
def test_fixed_size_kernels_against_scipy(dtype, n):
  rng = np.random.default_rng(n)
  a = random_array(rng, (lanes(dtype) + 5, n, n), dtype)
  b = random_array(rng, (lanes(dtype) + 5, n, 2), dtype)
  with small_path("lu", "always"):
    lu, pivots, perm, info = getrf(a, True)
    x, x_info = gesv(a, b, True)
  check_against_scipy(a, lu, pivots, perm, info)
  assert not x_info.any()
  assert_close(x, np.linalg.solve(a, b), dtype, n * np.linalg.cond(a).max())


# ---- through batchpart.linalg -------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_linalg_lu_and_solve(dtype):
  rng = np.random.default_rng(5)
  a = well_conditioned(rng, (5, 3, 16, 16), dtype)
  b = random_array(rng, (3, 16, 4), dtype)
  lu, pivots, perm = bp.linalg.lu(a)
  check_against_scipy(a, np.asarray(lu), np.asarray(pivots), np.asarray(perm),
                      np.zeros(a.shape[:-2], np.int32))
  assert_close(bp.linalg.solve(a, b), np.linalg.solve(a, b), dtype, 16)
  v = random_array(rng, (16,), dtype)
  assert_close(bp.linalg.solve(a, v), np.linalg.solve(a, v[:, None])[..., 0], dtype, 16)


@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
def test_gradients_through_the_interleaved_path(dtype):
  rng = np.random.default_rng(6)
  a = jnp.asarray(well_conditioned(rng, (17, 5, 5), dtype))
  b = jnp.asarray(random_array(rng, (17, 5, 2), dtype))
  loss = lambda f: (lambda a, b: jnp.sum(jnp.abs(f(a, b)) ** 2))
  ours = jax.grad(loss(bp.linalg.solve), argnums=(0, 1))(a, b)
  ref = jax.grad(loss(jnp.linalg.solve), argnums=(0, 1))(a, b)
  for x, y in zip(ours, ref):
    assert_close(x, y, dtype, 10)
  lu_loss = lambda f: (lambda a: jnp.sum(jnp.abs(f(a)[0]) ** 2))
  assert_close(jax.grad(lu_loss(bp.linalg.lu))(a), jax.grad(lu_loss(jax.lax.linalg.lu))(a),
               dtype, 10)
  tangent = jnp.asarray(random_array(rng, a.shape, dtype))
  _, ours = jax.jvp(lambda a: bp.linalg.lu(a)[0], (a,), (tangent,))
  _, ref = jax.jvp(lambda a: jax.lax.linalg.lu(a)[0], (a,), (tangent,))
  assert_close(ours, ref, dtype, 10)
