"""batchpart.linalg against NumPy/SciPy: every function x dtype, hypothesis
over batch shapes (empty batches, 1x1 matrices), reconstructions, NaN on
failure, and the same conventions as jax.numpy.linalg."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import batchpart as bp
from batchpart.testing import (
  DTYPES,
  assert_close as close,
  assert_lu,
  conj_transpose as H,
  hermitian_pd as hpd,
  random_array as rand,
)

# The float64 and complex128 cases need jax's 64-bit types.
pytestmark = pytest.mark.usefixtures("x64")



batch_shapes = st.sampled_from([(), (0,), (1,), (3,), (2, 3), (4, 0)])
sizes = st.sampled_from([1, 2, 5, 9])


@settings(max_examples=25, deadline=None)
@given(batch=batch_shapes, n=sizes, dtype=st.sampled_from(DTYPES), lower=st.booleans())
def test_cholesky(batch, n, dtype, lower):
  a = hpd(np.random.default_rng(0), batch, n, dtype)
  factor = bp.linalg.cholesky(a, lower=lower)
  assert factor.shape == a.shape and factor.dtype == dtype
  l = np.asarray(factor) if lower else H(np.asarray(factor))
  close(l @ H(l), a, dtype, scale=n)
  close(factor, jnp.linalg.cholesky(a, upper=not lower), dtype, scale=n)


@settings(max_examples=25, deadline=None)
@given(batch=batch_shapes, m=sizes, n=sizes, dtype=st.sampled_from(DTYPES))
def test_lu(batch, m, n, dtype):
  a = rand(np.random.default_rng(1), (*batch, m, n), dtype)
  lu, pivots, perm = bp.linalg.lu(a)
  assert_lu(a, lu, pivots, perm, dtype, scale=n)
  ref_lu, ref_piv, ref_perm = jax.lax.linalg.lu(a)
  np.testing.assert_array_equal(perm, ref_perm)
  np.testing.assert_array_equal(pivots, ref_piv)


@settings(max_examples=25, deadline=None)
@given(batch=batch_shapes, m=sizes, n=sizes, dtype=st.sampled_from(DTYPES),
       mode=st.sampled_from(["reduced", "complete", "r"]))
def test_qr(batch, m, n, dtype, mode):
  a = rand(np.random.default_rng(2), (*batch, m, n), dtype)
  out = bp.linalg.qr(a, mode=mode)
  ref = jnp.linalg.qr(a, mode=mode)
  if mode == "r":
    assert out.shape == ref.shape
    close(np.abs(np.asarray(out)), np.abs(np.asarray(ref)), dtype, scale=n)
    return
  q, r = map(np.asarray, out)
  assert q.shape == ref[0].shape and r.shape == ref[1].shape
  close(q @ r, a, dtype, scale=n)
  close(H(q) @ q, np.broadcast_to(np.eye(q.shape[-1]), (*batch, q.shape[-1], q.shape[-1])),
        dtype, scale=n)
  assert np.allclose(np.tril(r, -1), 0)


@settings(max_examples=25, deadline=None)
@given(batch=batch_shapes, n=sizes, dtype=st.sampled_from(DTYPES), lower=st.booleans())
def test_eigh(batch, n, dtype, lower):
  x = rand(np.random.default_rng(3), (*batch, n, n), dtype)
  a = (x + H(x)) / 2
  w, v = bp.linalg.eigh(a, lower=lower)
  assert w.dtype == np.finfo(dtype).dtype and v.dtype == dtype
  close(w, np.linalg.eigvalsh(a), dtype, scale=n)
  w, v = np.asarray(w), np.asarray(v)
  close((v * w[..., None, :]) @ H(v), a, dtype, scale=n)


@settings(max_examples=25, deadline=None)
@given(batch=batch_shapes, m=sizes, n=sizes, dtype=st.sampled_from(DTYPES),
       full=st.booleans())
def test_svd(batch, m, n, dtype, full):
  a = rand(np.random.default_rng(4), (*batch, m, n), dtype)
  u, s, vh = map(np.asarray, bp.linalg.svd(a, full_matrices=full))
  k = min(m, n)
  assert u.shape == (*batch, m, m if full else k) and vh.shape == (*batch, n if full else k, n)
  close(s, np.linalg.svd(a, compute_uv=False), dtype, scale=n)
  close((u[..., :, :k] * s[..., None, :]) @ vh[..., :k, :], a, dtype, scale=n)
  close(bp.linalg.svd(a, compute_uv=False), s, dtype, scale=n)


@settings(max_examples=25, deadline=None)
@given(a_batch=st.sampled_from([(), (3,), (1,), (2, 1)]),
       b_batch=st.sampled_from([(), (3,), (2, 3)]), n=sizes,
       dtype=st.sampled_from(DTYPES), left_side=st.booleans(), lower=st.booleans(),
       transpose=st.sampled_from([(False, False), (True, False), (True, True)]),
       unit_diagonal=st.booleans())
def test_triangular_solve(a_batch, b_batch, n, dtype, left_side, lower, transpose,
                          unit_diagonal):
  rng = np.random.default_rng(5)
  a = rand(rng, (*a_batch, n, n), dtype) + 3 * n * np.eye(n, dtype=dtype)
  b = rand(rng, (*b_batch, n, 2) if left_side else (*b_batch, 2, n), dtype)
  transpose_a, conjugate_a = transpose
  x = bp.linalg.triangular_solve(a, b, left_side=left_side, lower=lower,
                                 transpose_a=transpose_a, conjugate_a=conjugate_a,
                                 unit_diagonal=unit_diagonal)
  batch = np.broadcast_shapes(a_batch, b_batch)
  ab = np.broadcast_to(a, (*batch, n, n))
  ref = jax.lax.linalg.triangular_solve(
      ab, np.broadcast_to(b, (*batch, *b.shape[-2:])), left_side=left_side, lower=lower,
      transpose_a=transpose_a, conjugate_a=conjugate_a, unit_diagonal=unit_diagonal)
  close(x, ref, dtype, scale=n)


@settings(max_examples=25, deadline=None)
@given(a_batch=st.sampled_from([(), (3,), (1,), (0,)]),
       b_batch=st.sampled_from([(), (3,), (2, 1)]), n=sizes, dtype=st.sampled_from(DTYPES),
       vector=st.booleans())
def test_solve(a_batch, b_batch, n, dtype, vector):
  rng = np.random.default_rng(6)
  a = rand(rng, (*a_batch, n, n), dtype) + 2 * n * np.eye(n, dtype=dtype)
  b = rand(rng, (n,) if vector else (*b_batch, n, 3), dtype)
  if not vector:
    try:
      np.broadcast_shapes(a_batch, b_batch)
    except ValueError:
      return  # not a valid pair of batch shapes (tested in test_errors)
  x = bp.linalg.solve(a, b)
  close(x, jnp.linalg.solve(a, b), dtype, scale=n)
  assert x.shape == jnp.linalg.solve(a, b).shape


def test_cholesky_not_positive_definite_gives_nan_in_that_element():
  rng = np.random.default_rng(7)
  a = hpd(rng, (4,), 3, np.float64)
  a[2] = -np.eye(3)
  factor = np.asarray(bp.linalg.cholesky(a))
  assert np.isnan(factor[2]).all()
  close(factor[[0, 1, 3]], np.linalg.cholesky(a[[0, 1, 3]]), np.float64)


def test_singular_solve_gives_nan_in_that_element():
  rng = np.random.default_rng(8)
  a = rand(rng, (3, 4, 4), np.float64) + 4 * np.eye(4)
  a[1] = 0
  b = rand(rng, (3, 4, 2), np.float64)
  x = np.asarray(bp.linalg.solve(a, b))
  assert np.isnan(x[1]).all()
  close(x[[0, 2]], np.linalg.solve(a[[0, 2]], b[[0, 2]]), np.float64)


def test_eigh_and_svd_non_finite_give_nan_in_that_element():
  a = np.stack([np.eye(3), np.full((3, 3), np.nan), 2 * np.eye(3)])
  w, v = map(np.asarray, bp.linalg.eigh(a))
  assert np.isnan(w[1]).all() and np.isnan(v[1]).all()
  close(w[[0, 2]], [[1, 1, 1], [2, 2, 2]], np.float64)
  s = np.asarray(bp.linalg.svd(a, compute_uv=False))
  assert np.isnan(s[1]).all()
  close(s[[0, 2]], [[1, 1, 1], [2, 2, 2]], np.float64)


def test_integer_input_is_promoted_like_jnp():
  a = np.array([[4, 2], [2, 3]])
  assert bp.linalg.cholesky(a).dtype == jnp.linalg.cholesky(a).dtype


@pytest.mark.parametrize("fn,args,match", [
    (lambda a: bp.linalg.cholesky(a), (np.ones((3, 2)),), "cholesky: a must be square"),
    (lambda a: bp.linalg.eigh(a), (np.ones(3),), "eigh: a must have at least 2 dims"),
    (lambda a: bp.linalg.qr(a, mode="economic"), (np.ones((3, 3)),), "qr: mode must be"),
    (lambda a, b: bp.linalg.solve(a, b), (np.ones((3, 3)), np.ones(4)), "solve: b of shape"),
    (lambda a, b: bp.linalg.triangular_solve(a, b), (np.ones((3, 3)), np.ones((4, 2))),
     "triangular_solve: b of shape"),
])
def test_bad_input(fn, args, match):
  with pytest.raises((ValueError, TypeError), match=match):
    fn(*args)


def test_vmap_and_jit_are_one_call():
  a = hpd(np.random.default_rng(9), (3, 4), 3, np.float64)
  f = jax.jit(jax.vmap(bp.linalg.cholesky, in_axes=1))
  text = f.lower(a).as_text()
  assert text.count('stablehlo.custom_call @batchpart_potrf(') == 1 and "while" not in text
  close(f(a), np.linalg.cholesky(np.swapaxes(a, 0, 1)), np.float64)


# On CPU, lu, solve, triangular_solve and qr call row-major targets: the
# compiled program has no relayout (a transposing copy into or out of {1,2,0}) around
# the kernel, and the values are jax's.
@pytest.mark.parametrize("name, fn, reference", [
    ("batchpart_getrf_row_major", lambda a: bp.linalg.lu(a)[0],
     lambda a: jax.lax.linalg.lu(a)[0]),
    ("batchpart_gesv_row_major", lambda a: bp.linalg.solve(a, a[..., :3]),
     lambda a: jnp.linalg.solve(a, a[..., :3])),
    ("batchpart_trsm_row_major", lambda a: bp.linalg.triangular_solve(a, a[..., :3]),
     lambda a: jax.lax.linalg.triangular_solve(a, a[..., :3], left_side=True, lower=True)),
    ("batchpart_qr_row_major", lambda a: bp.linalg.qr(a), lambda a: jnp.linalg.qr(a)),
    ("batchpart_qr_row_major", lambda a: bp.linalg.qr(a[..., :5], mode="complete"),
     lambda a: jnp.linalg.qr(a[..., :5], mode="complete")),
])
def test_cpu_kernels_need_no_relayout(name, fn, reference):
  a = np.random.default_rng(3).standard_normal((4, 16, 16)).astype(np.float32) + 4 * np.eye(16)
  a = a.astype(np.float32)
  f = jax.jit(lambda a: fn(a * 2))  # an intermediate, as most operands are
  text = f.lower(a).compile().as_text()
  assert f"custom_call_target=\"{name}\"" in text
  assert "{1,2,0}" not in text
  for got, want in zip(jax.tree.leaves(f(a)), jax.tree.leaves(reference(a * 2)), strict=True):
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)
