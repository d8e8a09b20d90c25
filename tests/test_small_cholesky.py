"""The batch-interleaved Cholesky of small matrices (cc/lapack/small_cholesky.cc)
behind batchpart_potrf and batchpart_posv: values against NumPy, failures and
info against the LAPACK path the targets take above the size switch, and
derivatives through bp.linalg."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from jax.test_util import check_grads
from small_tables import BATCHES, FIXED_SIZE, MAX_FIXED, sizes_around

import batchpart as bp
from batchpart import _core
from batchpart._lapack_targets import column_major
from batchpart.testing import (
  DTYPES,
  assert_alone_as_in_batch,
  conj_transpose as herm,
  generic_kernels,
  hermitian_pd,
  lanes,
  random_array,
  small_path,
)

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("x64", "lapack_registered")]

MAX_SIZE, MAX_SOLVE_SIZE, MIN_GROUP = _core.lapack.small_cholesky_limits()
SIZES = sizes_around(MAX_SIZE)


def potrf(a, lower=True, symmetrize=False):
  call = jax.ffi.ffi_call(
      "batchpart_potrf",
      [jax.ShapeDtypeStruct(a.shape, a.dtype), jax.ShapeDtypeStruct(a.shape[:-2], np.int32)],
      input_layouts=[column_major(a.shape)], output_layouts=[column_major(a.shape), None])
  return tuple(np.asarray(r) for r in call(a, lower=lower, symmetrize=symmetrize))


def posv(a, b, lower=True):
  batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
  x_shape = (*batch, *b.shape[-2:])
  call = jax.ffi.ffi_call(
      "batchpart_posv",
      [jax.ShapeDtypeStruct(x_shape, b.dtype), jax.ShapeDtypeStruct(batch, np.int32)],
      input_layouts=[column_major(a.shape), column_major(b.shape)],
      output_layouts=[column_major(x_shape), None])
  return tuple(np.asarray(r) for r in call(a, b, lower=lower))


def tol(dtype, n):
  return (2e-4 if np.finfo(dtype).bits <= 32 else 1e-11) * max(n, 4)


def wide(a):
  return a.astype(np.complex128 if np.iscomplexobj(a) else np.float64)


def hermitian_from_triangle(a, lower):
  """The Hermitian matrix that a's lower (or upper) triangle and real diagonal hold."""
  strict = np.tril(a, -1) if lower else np.triu(a, 1)
  diagonal = np.real(np.diagonal(a, axis1=-2, axis2=-1))
  return wide(strict + herm(strict)) + diagonal[..., None, :] * np.eye(a.shape[-1])


def reference_factor(a, lower):
  factor = np.linalg.cholesky(hermitian_from_triangle(a, lower))
  return factor if lower else herm(factor)


def assert_factor(factor, info, a, lower, dtype):
  n = a.shape[-1]
  assert not info.any()
  scale = np.abs(a).max()
  np.testing.assert_allclose(factor, reference_factor(a, lower), rtol=tol(dtype, n),
                             atol=tol(dtype, n) * np.sqrt(scale))
  other = np.triu(factor, 1) if lower else np.tril(factor, -1)
  assert not other.any()


# ---- potrf --------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lower", [True, False])
@pytest.mark.parametrize("symmetrize", [False, True])
@pytest.mark.parametrize("n", SIZES)
def test_potrf_matches_numpy(n, dtype, lower, symmetrize):
  rng = np.random.default_rng(n)
  batch = BATCHES[SIZES.index(n) % len(BATCHES)]
  a = hermitian_pd(rng, (batch,), n, dtype)
  if symmetrize:
    skew = random_array(rng, a.shape, dtype)
    given = (a + (skew - herm(skew)) / 4).astype(dtype)  # the same Hermitian part
  else:
    # Garbage in the triangle the kernel must not read.
    junk = random_array(rng, a.shape, dtype) * 100
    given = (np.where(np.tri(n, dtype=bool), a, junk) if lower
             else np.where(np.tri(n, dtype=bool).T, a, junk)).astype(dtype)
  factor, info = potrf(given, lower=lower, symmetrize=symmetrize)
  assert factor.dtype == dtype and info.shape == (batch,)
  assert_factor(factor, info, a, lower, dtype)
  if np.iscomplexobj(factor):
    assert not np.imag(np.diagonal(factor, axis1=-2, axis2=-1)).any()


@pytest.mark.parametrize("batch", [*BATCHES, MIN_GROUP - 1, MIN_GROUP, 8, 16, 33])
@pytest.mark.parametrize("dtype", [np.float32, np.complex128])
def test_potrf_batches_that_do_not_fill_the_lanes(batch, dtype):
  a = hermitian_pd(np.random.default_rng(batch), (batch,), 5, dtype)
  factor, info = potrf(a)
  assert_factor(factor, info, a, True, dtype)


def test_potrf_multiple_batch_dims():
  a = hermitian_pd(np.random.default_rng(1), (3, 7), 6, np.float64)
  factor, info = potrf(a, lower=False)
  assert info.shape == (3, 7)
  assert_factor(factor, info, a, False, np.float64)


def failing_batch(rng, n, dtype):
  """17 matrices, some of them failing in different ways, and potrf's info
  for each (reference LAPACK's: a NaN pivot fails)."""
  a = hermitian_pd(rng, (17,), n, dtype)
  expected = np.zeros(17, np.int32)
  a[3] = -a[3]  # negative definite: the first pivot fails
  expected[3] = 1
  if n >= 2:
    k = n // 2  # the leading minor of order k + 1 is the first not positive definite
    a[6, k, k] = np.real(a[6, k, :k] @ np.linalg.solve(a[6, :k, :k], a[6, :k, k])) - 1
    expected[6] = k + 1
  a[9, n - 1, 0] = a[9, 0, n - 1] = np.nan  # NaN: fails at the first NaN pivot, row n - 1
  expected[9] = n
  a[12, 0, 0] = np.nan
  expected[12] = 1
  # All inf: OpenBLAS's unblocked potrf (up to n = 32) scales the first
  # column by 1 / inf = 0 and writes zeros, an infinite factor and no
  # failure; its blocked one fails later. Only the paths' agreement is checked.
  a[14] = np.inf
  expected[14] = -1
  return a, expected


def assert_fails_as_lapack(result, info, lapack_result, lapack_info, expected):
  """Asserts a failing_batch's result fails where LAPACK's does, with its
  info, as NaN; the all-inf element as LAPACK has it. Returns the mask of
  the elements left to check against a reference."""
  np.testing.assert_array_equal(info, lapack_info)
  np.testing.assert_array_equal(info[expected >= 0], expected[expected >= 0])
  failed = info != 0
  assert np.isnan(result[failed]).all() and np.isnan(lapack_result[failed]).all()
  np.testing.assert_array_equal(result[14], lapack_result[14])
  return ~failed & (np.arange(len(info)) != 14)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 2, 5, 8, 16, MAX_SIZE, MAX_SIZE + 1])
@pytest.mark.parametrize("lower", [True, False])
def test_potrf_failures_are_nan_in_that_element_only(n, dtype, lower):
  a, expected = failing_batch(np.random.default_rng(n), n, dtype)
  factor, info = potrf(a, lower=lower)
  with small_path("cholesky", "never"):
    lapack_factor, lapack_info = potrf(a, lower=lower)
  ok = assert_fails_as_lapack(factor, info, lapack_factor, lapack_info, expected)
  assert np.isfinite(factor[ok]).all()
  assert_factor(factor[ok], info[ok], a[ok], lower, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", sorted({1, 2, 4, 8, 13, MAX_SIZE - 1, MAX_SIZE, MAX_SIZE + 1}))
@pytest.mark.parametrize("symmetrize", [False, True])
def test_both_paths_agree(n, dtype, symmetrize):
  rng = np.random.default_rng(3)
  a = hermitian_pd(rng, (11,), n, dtype) + random_array(rng, (11, n, n), dtype) / 8
  for lower in (True, False):
    factor, info = potrf(a.astype(dtype), lower=lower, symmetrize=symmetrize)
    with small_path("cholesky", "never"):
      expected, expected_info = potrf(a.astype(dtype), lower=lower, symmetrize=symmetrize)
    np.testing.assert_array_equal(info, expected_info)
    np.testing.assert_allclose(factor, expected, rtol=tol(dtype, n), atol=tol(dtype, n))


# ---- posv ---------------------------------------------------------------------


def reference_solve(a, b, lower):
  batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
  full = np.broadcast_to(hermitian_from_triangle(a, lower), (*batch, *a.shape[-2:]))
  return np.linalg.solve(full, np.broadcast_to(wide(b), (*batch, *b.shape[-2:])))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 3, 8, 16, MAX_SOLVE_SIZE, MAX_SOLVE_SIZE + 1])
@pytest.mark.parametrize("lower", [True, False])
@pytest.mark.parametrize("a_batch,b_batch,r", [
    ((17,), (17,), 1), ((1,), (9,), 3), ((9,), (), 2), ((3, 1), (1, 6), 4), ((), (20,), 1)])
def test_posv_matches_numpy(n, dtype, lower, a_batch, b_batch, r):
  rng = np.random.default_rng(n + r)
  a = hermitian_pd(rng, a_batch, n, dtype)
  junk = random_array(rng, a.shape, dtype) * 100
  mask = np.tri(n, dtype=bool) if lower else np.tri(n, dtype=bool).T
  a_given = np.where(mask, a, junk).astype(dtype)
  b = random_array(rng, (*b_batch, n, r), dtype)
  x, info = posv(a_given, b, lower=lower)
  assert not info.any()
  np.testing.assert_allclose(x, reference_solve(a, b, lower), rtol=tol(dtype, n) * 10,
                             atol=tol(dtype, n) * 10)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [2, 8, MAX_SOLVE_SIZE, MAX_SOLVE_SIZE + 1])
@pytest.mark.parametrize("lower", [True, False])
def test_posv_failures_are_nan_in_that_element_only(n, dtype, lower):
  rng = np.random.default_rng(n)
  a, expected = failing_batch(rng, n, dtype)
  b = random_array(rng, (17, n, 2), dtype)
  x, info = posv(a, b, lower=lower)
  with small_path("cholesky", "never"):
    lapack_x, lapack_info = posv(a, b, lower=lower)
  ok = assert_fails_as_lapack(x, info, lapack_x, lapack_info, expected)
  np.testing.assert_allclose(x[ok], lapack_x[ok], rtol=tol(dtype, n) * 10,
                             atol=tol(dtype, n) * 10)


def test_solve_pos_through_bp_linalg_broadcasts():
  rng = np.random.default_rng(5)
  a = hermitian_pd(rng, (6, 1), 4, np.float64)
  b = random_array(rng, (5, 4, 3), np.float64)
  x = bp.linalg.solve(a, b, assume_a="pos")
  np.testing.assert_allclose(np.asarray(x), np.linalg.solve(a, b), rtol=1e-10, atol=1e-10)


# ---- the fixed-size kernels (cc/lapack/small_cholesky_fixed.*) ------------------------


def troubled(rng, batch, n, dtype, kinds):
  """Hermitian positive definite matrices with, per batch element, kinds[i]
  of: 0 none, 1 negative definite, 2 a NaN, 3 an infinity, 4 all zero,
  5 a pivot that reaches zero after elimination (a singular trailing minor),
  6 a non-symmetric perturbation (what symmetrize averages away)."""
  a = wide(hermitian_pd(rng, (batch,), n, dtype))
  for i, kind in enumerate(kinds):
    k = int(rng.integers(n))
    if kind == 1:
      a[i] = -a[i]
    elif kind == 2:
      a[i, int(rng.integers(n)), k] = np.nan
    elif kind == 3:
      a[i, int(rng.integers(n)), k] = np.inf
    elif kind == 4:
      a[i] = 0
    elif kind == 5 and k > 0:
      a[i, k, k] = np.real(a[i, k, :k] @ np.linalg.solve(a[i, :k, :k], a[i, :k, k]))
    elif kind == 6:
      a[i] += random_array(rng, (n, n), a.dtype)
  return a.astype(dtype)


@FIXED_SIZE
@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, MAX_FIXED + 1), dtype=st.sampled_from(DTYPES), lower=st.booleans(),
       kinds=st.lists(st.integers(0, 6), min_size=1, max_size=40), seed=st.integers(0, 2**16))
def test_fixed_size_kernels_give_the_generic_kernels_bits(n, dtype, lower, kinds, seed):
  # The solve has fixed-size kernels for the real types only; complex x still
  # checks the factor it solves with.
  rng = np.random.default_rng(seed)
  a = troubled(rng, len(kinds), n, dtype, kinds)
  b = random_array(rng, (len(kinds), n, 1 + seed % 3), dtype)

  def run():
    return (*potrf(a, lower=lower), *potrf(a, lower=lower, symmetrize=True),
            *posv(a, b, lower=lower))

  with small_path("cholesky", "always"):
    got = run()
    with generic_kernels():
      expected = run()
  for name, g, e in zip(("factor", "info", "symmetrized factor", "symmetrized info", "x",
                         "x info"), got, expected, strict=True):
    np.testing.assert_array_equal(g, e, err_msg=f"{name}, n = {n}")


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, MAX_SIZE + 1), dtype=st.sampled_from(DTYPES), lower=st.booleans(),
       kinds=st.lists(st.integers(0, 6), min_size=MIN_GROUP, max_size=MIN_GROUP + 3),
       seed=st.integers(0, 2**16))
def test_a_lone_matrix_gets_the_bits_of_its_group(n, dtype, lower, kinds, seed):
  # A batch of one runs the one-matrix twins, a batch of MIN_GROUP or more a
  # group: the same bits on failures, NaN, infinities and singular minors.
  rng = np.random.default_rng(seed)
  a = troubled(rng, len(kinds), n, dtype, kinds)
  b = random_array(rng, (len(kinds), n, 1 + seed % 3), dtype)
  for symmetrize in (False, True):
    assert_alone_as_in_batch(lambda a, s=symmetrize: potrf(a, lower=lower, symmetrize=s), (a,),
                             f"potrf n = {n}, symmetrize = {symmetrize}")
  assert_alone_as_in_batch(lambda a, b: posv(a, b, lower=lower), (a, b), f"posv n = {n}")


@FIXED_SIZE
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", range(1, MAX_FIXED + 2))
def test_fixed_size_kernels_against_numpy(dtype, n):
  rng = np.random.default_rng(n)
  a = hermitian_pd(rng, (lanes(dtype) + 5,), n, dtype)
  b = random_array(rng, (lanes(dtype) + 5, n, 2), dtype)
  with small_path("cholesky", "always"):
    for lower in (True, False):
      factor, info = potrf(a, lower=lower)
      assert_factor(factor, info, a, lower, dtype)
      x, x_info = posv(a, b, lower=lower)
      assert not x_info.any()
      np.testing.assert_allclose(x, reference_solve(a, b, lower), rtol=tol(dtype, n),
                                 atol=tol(dtype, n))


# ---- derivatives through the existing JVP rules --------------------------------


def squared_norm(f):
  return lambda x: jnp.sum(jnp.abs(f(x)) ** 2)


@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
@pytest.mark.parametrize("lower", [True, False])
def test_cholesky_gradients_on_the_interleaved_path(dtype, lower):
  a = hermitian_pd(np.random.default_rng(0), (9,), 4, dtype)
  ours = functools.partial(bp.linalg.cholesky, lower=lower)
  theirs = functools.partial(jnp.linalg.cholesky, upper=not lower)
  tangent = random_array(np.random.default_rng(1), a.shape, dtype)
  tangent = tangent + herm(tangent)
  np.testing.assert_allclose(np.asarray(jax.jvp(ours, (a,), (tangent,))[1]),
                             np.asarray(jax.jvp(theirs, (a,), (tangent,))[1]),
                             rtol=1e-9, atol=1e-9)
  np.testing.assert_allclose(np.asarray(jax.grad(squared_norm(ours))(a)),
                             np.asarray(jax.grad(squared_norm(theirs))(a)), rtol=1e-9, atol=1e-9)
  sym = lambda x: (x + jnp.conj(jnp.swapaxes(x, -1, -2))) / 2  # noqa: E731
  check_grads(lambda x: ours(sym(x)), (a,), order=1, modes=("fwd", "rev"))


def test_solve_pos_gradients_on_the_interleaved_path():
  rng = np.random.default_rng(2)
  a = hermitian_pd(rng, (9,), 5, np.float64)
  b = random_array(rng, (9, 5, 2), np.float64)
  sym = lambda x: (x + jnp.swapaxes(x, -1, -2)) / 2  # noqa: E731
  ours = jax.grad(lambda x, y: jnp.sum(bp.linalg.solve(sym(x), y, assume_a="pos") ** 2),
                  argnums=(0, 1))(a, b)
  theirs = jax.grad(lambda x, y: jnp.sum(jnp.linalg.solve(sym(x), y) ** 2), argnums=(0, 1))(a, b)
  for o, t in zip(ours, theirs):
    np.testing.assert_allclose(np.asarray(o), np.asarray(t), rtol=1e-8, atol=1e-8)
  check_grads(lambda x, y: bp.linalg.solve(sym(x), y, assume_a="pos"), (a, b), order=1,
              modes=("fwd", "rev"))
