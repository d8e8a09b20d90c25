"""batchpart.linalg's jax options against NumPy/SciPy: one-triangle eigh and
Cholesky, SVD algorithms and hermitian SVD, QR modes and pivoting, solve's
assume_a, 1-D triangular_solve right-hand sides, jax's exception types, and
derivatives under jax's strict rank promotion (also on empty batches)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg
from hypothesis import given, settings, strategies as st
from jax.lax.linalg import EighImplementation, SvdAlgorithm
from jax.test_util import check_grads

import batchpart as bp
from batchpart.linalg import _kernels
from batchpart.testing import (
  DTYPES,
  assert_close as close,
  conj_transpose as H,
  hermitian_pd,
  random_array as rand,
)

# The float64 and complex128 cases need jax's 64-bit types.
pytestmark = pytest.mark.usefixtures("x64")


batch_shapes = st.sampled_from([(), (0,), (1,), (3,), (2, 2)])
sizes = st.sampled_from([1, 2, 4, 7])


def from_triangle(x, lower):
  """The Hermitian matrix a one-triangle LAPACK routine sees in x."""
  strict = np.tril(x, -1) if lower else np.triu(x, 1)
  diagonal = np.real(np.diagonal(x, axis1=-2, axis2=-1))
  return strict + H(strict) + diagonal[..., None, :] * np.eye(x.shape[-1])


def with_garbage(rng, h, lower):
  """h with its other strict triangle replaced by unrelated values."""
  junk = 100 * rand(rng, h.shape, h.dtype)
  mask = np.tril(np.ones(h.shape[-2:], bool)) if lower else np.triu(np.ones(h.shape[-2:], bool))
  return np.where(mask, h, junk).astype(h.dtype)


# ---- eigh / cholesky: one triangle ----------------------------------------------

@settings(max_examples=20, deadline=None)
@given(batch=batch_shapes, n=sizes, dtype=st.sampled_from(DTYPES), lower=st.booleans())
def test_eigh_without_symmetrization_reads_one_triangle(batch, n, dtype, lower):
  rng = np.random.default_rng(0)
  x = rand(rng, (*batch, n, n), dtype)
  h = ((x + H(x)) / 2).astype(dtype)
  a = with_garbage(rng, h, lower)
  w, v = bp.linalg.eigh(a, lower=lower, symmetrize_input=False, sort_eigenvalues=False)
  close(w, np.linalg.eigvalsh(h, UPLO="L" if lower else "U"), dtype, scale=n)
  w, v = np.asarray(w), np.asarray(v)
  close((v * w[..., None, :]) @ H(v), h, dtype, scale=n)
  if batch == ():
    ref = scipy.linalg.eigh(a, lower=lower, eigvals_only=True)
    close(w, ref, dtype, scale=n)


@settings(max_examples=15, deadline=None)
@given(batch=batch_shapes, n=sizes, dtype=st.sampled_from(DTYPES), lower=st.booleans())
def test_cholesky_without_symmetrization_reads_the_lower_triangle(batch, n, dtype, lower):
  rng = np.random.default_rng(1)
  x = rand(rng, (*batch, n, n), dtype)
  h = (x @ H(x) + n * np.eye(n)).astype(dtype)
  a = with_garbage(rng, h, lower=True)
  factor = bp.linalg.cholesky(a, lower=lower, symmetrize_input=False)
  ref = np.linalg.cholesky(h)
  close(factor, ref if lower else H(ref), dtype, scale=n)


# ---- SVD ------------------------------------------------------------------------

@settings(max_examples=20, deadline=None)
@given(batch=batch_shapes, m=st.sampled_from([0, 1, 3, 6]), n=st.sampled_from([0, 1, 4]),
       dtype=st.sampled_from(DTYPES), full=st.booleans(), compute_uv=st.booleans())
def test_svd_qr_algorithm_is_gesvd(batch, m, n, dtype, full, compute_uv):
  a = rand(np.random.default_rng(2), (*batch, m, n), dtype)
  out = bp.linalg.svd(a, full_matrices=full, compute_uv=compute_uv, algorithm=SvdAlgorithm.QR)
  ref_s = np.linalg.svd(a, compute_uv=False) if a.size else np.zeros((*batch, min(m, n)))
  if not compute_uv:
    close(out, ref_s, dtype, scale=max(m, n, 1))
    return
  u, s, vh = map(np.asarray, out)
  k = min(m, n)
  assert u.shape == (*batch, m, m if full else k) and vh.shape == (*batch, n if full else k, n)
  close(s, ref_s, dtype, scale=max(m, n, 1))
  close((u[..., :, :k] * s[..., None, :]) @ vh[..., :k, :], a, dtype, scale=max(m, n, 1))
  if batch == () and k:
    lapack = scipy.linalg.svd(a, full_matrices=full, lapack_driver="gesvd")[1]
    close(s, lapack, dtype, scale=max(m, n))


@pytest.mark.parametrize("algorithm", [None, SvdAlgorithm.DEFAULT,
                                       SvdAlgorithm.DIVIDE_AND_CONQUER])
def test_svd_divide_and_conquer_algorithms_are_gesdd(algorithm):
  a = rand(np.random.default_rng(3), (3, 5, 4), np.float64)
  u, s, vh = bp.linalg.svd(a, algorithm=algorithm)
  close(s, np.linalg.svd(a, compute_uv=False), np.float64)
  text = jax.jit(lambda a: bp.linalg.svd(a, algorithm=algorithm)).lower(a).as_text()
  assert '@batchpart_svd(' in text and "batchpart_gesvd" not in text


@pytest.mark.parametrize("algorithm", [SvdAlgorithm.JACOBI, SvdAlgorithm.POLAR])
def test_svd_algorithms_without_cpu_kernel_raise_like_jax(algorithm):
  with pytest.raises(NotImplementedError, match=r"svd: algorithm=.*not implemented on CPU"):
    bp.linalg.svd(np.eye(3), algorithm=algorithm)


@settings(max_examples=15, deadline=None)
@given(batch=batch_shapes, n=st.sampled_from([0, 1, 3, 5]), dtype=st.sampled_from(DTYPES),
       compute_uv=st.booleans())
def test_hermitian_svd_matches_numpy(batch, n, dtype, compute_uv):
  x = rand(np.random.default_rng(4), (*batch, n, n), dtype)
  a = (x + H(x)).astype(dtype)
  ref = np.linalg.svd(a, compute_uv=False, hermitian=True) if a.size else \
      np.zeros((*batch, n))
  out = bp.linalg.svd(a, compute_uv=compute_uv, hermitian=True)
  if not compute_uv:
    close(out, ref, dtype, scale=max(n, 1))
    return
  u, s, vh = map(np.asarray, out)
  close(s, ref, dtype, scale=max(n, 1))
  close((u * s[..., None, :]) @ vh, a, dtype, scale=max(n, 1))


# ---- QR -------------------------------------------------------------------------

@settings(max_examples=15, deadline=None)
@given(m=st.sampled_from([0, 1, 3, 5]), n=st.sampled_from([0, 1, 4]),
       dtype=st.sampled_from(DTYPES))
def test_qr_raw_and_full_modes_match_numpy(m, n, dtype):
  a = rand(np.random.default_rng(5), (m, n), dtype)
  h, tau = map(np.asarray, bp.linalg.qr(a, mode="raw"))
  ref_h, ref_tau = np.linalg.qr(a, mode="raw")
  assert h.shape == ref_h.shape and tau.shape == ref_tau.shape
  close(h, ref_h, dtype, scale=max(m, n, 1))
  close(tau, ref_tau, dtype, scale=max(m, n, 1))
  q, r = bp.linalg.qr(a, mode="full")
  q_ref, r_ref = bp.linalg.qr(a, mode="reduced")
  close(q, q_ref, dtype)
  close(r, r_ref, dtype)


def test_qr_raw_batched_and_not_differentiable():
  a = rand(np.random.default_rng(6), (2, 3, 4, 2), np.float64)
  h, tau = bp.linalg.qr(a, mode="raw")
  for index in np.ndindex(2, 3):
    ref_h, ref_tau = np.linalg.qr(a[index], mode="raw")
    close(h[index], ref_h, np.float64)
    close(tau[index], ref_tau, np.float64)
  with pytest.raises(NotImplementedError, match="mode='raw' is not differentiable"):
    jax.grad(lambda a: bp.linalg.qr(a, mode="raw")[0].sum())(a)


@settings(max_examples=20, deadline=None)
@given(batch=batch_shapes, m=st.sampled_from([0, 1, 3, 5]), n=st.sampled_from([0, 1, 4]),
       dtype=st.sampled_from(DTYPES), mode=st.sampled_from(["reduced", "complete", "r"]))
def test_pivoted_qr_matches_scipy(batch, m, n, dtype, mode):
  a = rand(np.random.default_rng(7), (*batch, m, n), dtype)
  out = bp.linalg.qr(a, mode=mode, pivoting=True)
  if mode == "r":
    r, p = map(np.asarray, out)
  else:
    q, r, p = map(np.asarray, out)
  assert p.dtype == np.int32 and p.shape == (*batch, n)
  np.testing.assert_array_equal(np.sort(p, axis=-1), np.broadcast_to(np.arange(n), p.shape))
  if mode != "r":
    permuted = np.take_along_axis(a, p[..., None, :], axis=-1)
    close(q @ r, permuted, dtype, scale=max(m, n, 1))
  assert np.allclose(np.tril(r, -1), 0)
  for index in np.ndindex(*batch):
    if m and n:
      scipy_mode = {"reduced": "economic", "complete": "full", "r": "economic"}[mode]
      ref = scipy.linalg.qr(a[index], mode=scipy_mode, pivoting=True)
      np.testing.assert_array_equal(p[index], ref[-1])
      k = min(m, n)
      close(np.abs(r[index][:k]), np.abs(ref[-2][:k]), dtype, scale=max(m, n))


# ---- solve ----------------------------------------------------------------------

@settings(max_examples=20, deadline=None)
@given(a_batch=st.sampled_from([(), (3,), (1,), (0,)]), b_batch=st.sampled_from([(), (3,)]),
       n=sizes, dtype=st.sampled_from(DTYPES), lower=st.booleans(),
       assume_a=st.sampled_from(["pos", "sym", "her"]), vector=st.booleans())
def test_solve_assume_a_reads_one_triangle_like_scipy(a_batch, b_batch, n, dtype, lower,
                                                      assume_a, vector):
  rng = np.random.default_rng(8)
  x = rand(rng, (*a_batch, n, n), dtype)
  if assume_a == "pos":
    full = x @ H(x) + n * np.eye(n)
  elif assume_a == "her":
    full = x + H(x) + 3 * n * np.eye(n)
  else:
    full = x + np.swapaxes(x, -1, -2) + 3 * n * np.eye(n)
  full = full.astype(dtype)
  a = with_garbage(rng, full, lower)
  b = rand(rng, (n,) if vector else (*b_batch, n, 2), dtype)
  if not vector:
    try:
      np.broadcast_shapes(a_batch, b_batch)
    except ValueError:
      return  # not a valid pair of batch shapes
  out = bp.linalg.solve(a, b, assume_a=assume_a, lower=lower)
  ref = np.linalg.solve(full, b[..., None])[..., 0] if vector else np.linalg.solve(full, b)
  assert out.shape == ref.shape
  close(out, ref, dtype, scale=10 * n)
  if a_batch == () and (vector or b_batch == ()):
    close(out, scipy.linalg.solve(a, b, assume_a=assume_a, lower=lower), dtype, scale=10 * n)


def test_solve_pos_not_positive_definite_is_nan_in_that_element():
  rng = np.random.default_rng(9)
  x = rand(rng, (3, 4, 4), np.float64)
  a = x @ H(x) + 4 * np.eye(4)
  a[1] = -np.eye(4)
  b = rand(rng, (3, 4, 2), np.float64)
  out = np.asarray(bp.linalg.solve(a, b, assume_a="pos"))
  assert np.isnan(out[1]).all()
  close(out[[0, 2]], np.linalg.solve(a[[0, 2]], b[[0, 2]]), np.float64)


def test_solve_rejects_unknown_assume_a():
  with pytest.raises(ValueError, match=r"solve: assume_a must be one of"):
    bp.linalg.solve(np.eye(2), np.ones(2), assume_a="diagonal")


# ---- triangular_solve with a vector right-hand side ----------------------------

@settings(max_examples=20, deadline=None)
@given(batch=st.sampled_from([(), (3,), (2, 2)]), n=sizes, dtype=st.sampled_from(DTYPES),
       left_side=st.booleans(), lower=st.booleans(), transpose_a=st.booleans(),
       unit_diagonal=st.booleans())
def test_triangular_solve_vector_rhs_like_jax(batch, n, dtype, left_side, lower, transpose_a,
                                              unit_diagonal):
  rng = np.random.default_rng(10)
  a = rand(rng, (*batch, n, n), dtype) + 3 * n * np.eye(n, dtype=dtype)
  b = rand(rng, (*batch, n), dtype)
  x = bp.linalg.triangular_solve(a, b, left_side=left_side, lower=lower,
                                 transpose_a=transpose_a, unit_diagonal=unit_diagonal)
  assert x.shape == b.shape
  ref = jax.lax.linalg.triangular_solve(a, b, left_side=left_side, lower=lower,
                                        transpose_a=transpose_a, unit_diagonal=unit_diagonal)
  close(x, ref, dtype, scale=n)
  if batch == ():
    # x op(a) = b is op(a)^T x = b for a vector.
    trans = int(transpose_a) if left_side else int(not transpose_a)
    sp = scipy.linalg.solve_triangular(a, b, lower=lower, trans=trans,
                                       unit_diagonal=unit_diagonal)
    close(x, sp, dtype, scale=n)


def test_pivoted_qr_jvp_under_jit():
  a = rand(np.random.default_rng(15), (4, 3), np.float32)
  qr = jax.jit(lambda a: tuple(bp.linalg.qr(a, pivoting=True)))

  def identity(a):  # q r with the pivoting undone
    q, r, p = qr(a)
    return (q @ r)[:, jnp.argsort(p)]

  _, tangent = jax.jvp(identity, (a,), (a,))
  close(tangent, a, np.float32, scale=10)


def test_triangular_solve_vector_rhs_gradient():
  rng = np.random.default_rng(11)
  a = np.tril(rand(rng, (4, 4), np.float64)) + 5 * np.eye(4)
  b = rand(rng, (4,), np.float64)
  f = lambda a, b: bp.linalg.triangular_solve(a, b, left_side=True, lower=True)
  check_grads(f, (a, b), order=1, modes=("fwd", "rev"), atol=1e-6, rtol=1e-6)


# ---- exception types ------------------------------------------------------------

@pytest.mark.parametrize("name,call", [
    ("cholesky", lambda a: bp.linalg.cholesky(a)),
    ("lu", lambda a: bp.linalg.lu(a)),
    ("qr", lambda a: bp.linalg.qr(a)),
    ("eigh", lambda a: bp.linalg.eigh(a)),
    ("svd", lambda a: bp.linalg.svd(a)),
    ("solve", lambda a: bp.linalg.solve(a, a)),
    ("triangular_solve", lambda a: bp.linalg.triangular_solve(a, a)),
])
@pytest.mark.parametrize("dtype", [np.float16, jnp.bfloat16])
def test_unsupported_float_dtypes_raise_not_implemented_like_jax(name, call, dtype):
  a = np.eye(3).astype(dtype)
  with pytest.raises(NotImplementedError, match=rf"{name}: Unsupported dtype {np.dtype(dtype)}"):
    call(a)


def test_unknown_qr_mode_raises_value_error():
  with pytest.raises(ValueError, match="qr: mode must be one of"):
    bp.linalg.qr(np.eye(2), mode="economic")


@pytest.mark.parametrize("call,target", [
    (lambda a: bp.linalg.qr(a, pivoting=True), "batchpart_geqp3"),
    (lambda a: bp.linalg.qr(a, mode="raw"), "batchpart_geqrf"),
    (lambda a: bp.linalg.svd(a, algorithm=SvdAlgorithm.QR), "batchpart_gesvd"),
    (lambda a: bp.linalg.solve(a, a, assume_a="pos"), "batchpart_posv"),
])
def test_cpu_only_options_name_their_target_on_other_platforms(monkeypatch, call, target):
  monkeypatch.setattr(_kernels, "_platform_of", lambda operands: "cuda")
  with pytest.raises(NotImplementedError, match=rf"CPU-only LAPACK target {target}.*'cuda'"):
    call(np.eye(3))
  monkeypatch.setattr(_kernels, "_platform_of", lambda operands: "cpu")
  call(np.eye(3))


# ---- derivatives under jax's strict settings ------------------------------------

def _sym(x):
  return (x + np.conj(np.swapaxes(x, -1, -2))) / 2


def _spd(rng, shape, dtype=np.float64):
  x = rand(rng, shape, dtype)
  return x @ H(x) + shape[-1] * np.eye(shape[-1])


GRAD_CASES = {
    "cholesky": (lambda a: bp.linalg.cholesky(a), lambda a: jnp.linalg.cholesky(a),
                 lambda rng, b: (_spd(rng, (*b, 3, 3)),)),
    "cholesky_no_symmetrize": (lambda a: bp.linalg.cholesky(a, symmetrize_input=False),
                               lambda a: jnp.linalg.cholesky(a, symmetrize_input=False),
                               lambda rng, b: (_spd(rng, (*b, 3, 3)),)),
    "lu": (lambda a: bp.linalg.lu(a)[0], lambda a: jax.lax.linalg.lu(a)[0],
           lambda rng, b: (rand(rng, (*b, 3, 4), np.float64),)),
    "qr_tall": (lambda a: bp.linalg.qr(a), lambda a: jnp.linalg.qr(a),
                lambda rng, b: (rand(rng, (*b, 5, 3), np.float64),)),
    "qr_wide": (lambda a: bp.linalg.qr(a), lambda a: jnp.linalg.qr(a),
                lambda rng, b: (rand(rng, (*b, 3, 5), np.float64),)),
    "qr_complete_tall": (lambda a: bp.linalg.qr(a, mode="complete"),
                         lambda a: jnp.linalg.qr(a, mode="complete"),
                         lambda rng, b: (rand(rng, (*b, 5, 3), np.float64),)),
    "qr_complete_wide": (lambda a: bp.linalg.qr(a, mode="complete"),
                         lambda a: jnp.linalg.qr(a, mode="complete"),
                         lambda rng, b: (rand(rng, (*b, 3, 5), np.float64),)),
    "qr_pivoted": (lambda a: tuple(bp.linalg.qr(a, pivoting=True))[:2],
                   # jax's pivoted-QR JVP mis-indexes batched (and vmapped) tangents:
                   # the reference loops over the batch.
                   lambda a: jax.lax.linalg.qr(a, pivoting=True, full_matrices=False)[:2],
                   lambda rng, b: (rand(rng, (*b, 5, 3), np.float64),)),
    "eigh": (lambda a: bp.linalg.eigh(a)[0], lambda a: jnp.linalg.eigh(a)[0],
             lambda rng, b: (_sym(rand(rng, (*b, 4, 4), np.float64)),)),
    "eigh_upper_no_symmetrize": (
        lambda a: bp.linalg.eigh(a, lower=False, symmetrize_input=False)[0],
        lambda a: jnp.linalg.eigh(a, UPLO="U", symmetrize_input=False)[0],
        lambda rng, b: (_sym(rand(rng, (*b, 4, 4), np.float64)),)),
    "svd": (lambda a: bp.linalg.svd(a, compute_uv=False),
            lambda a: jnp.linalg.svd(a, compute_uv=False),
            lambda rng, b: (rand(rng, (*b, 4, 3), np.float64),)),
    "svd_qr": (lambda a: bp.linalg.svd(a, compute_uv=False, algorithm=SvdAlgorithm.QR),
               lambda a: jax.lax.linalg.svd(a, compute_uv=False, algorithm=SvdAlgorithm.QR),
               lambda rng, b: (rand(rng, (*b, 3, 4), np.float64),)),
    "svd_hermitian": (lambda a: bp.linalg.svd(a, compute_uv=False, hermitian=True),
                      lambda a: jnp.linalg.svd(a, compute_uv=False, hermitian=True),
                      lambda rng, b: (_sym(rand(rng, (*b, 4, 4), np.float64)),)),
    "solve_pos": (lambda a, b: bp.linalg.solve(a, b, assume_a="pos", lower=True),
                  lambda a, b: jax.scipy.linalg.solve(a, b, assume_a="pos", lower=True),
                  lambda rng, b: (_spd(rng, (*b, 3, 3)), rand(rng, (*b, 3, 2), np.float64))),
}


@pytest.mark.parametrize("name", sorted(GRAD_CASES))
@pytest.mark.parametrize("batch", [(2,), (0,)])
def test_jvp_matches_jax_under_strict_rank_promotion(name, batch):
  ours, ref, make = GRAD_CASES[name]
  rng = np.random.default_rng(12)
  args = make(rng, batch)
  tangents = tuple(rand(rng, np.shape(a), np.float64) for a in args)
  if name.startswith(("cholesky", "eigh", "svd_hermitian", "solve_pos")):
    tangents = (_sym(tangents[0]),) + tangents[1:]
  as_tuple = lambda f: lambda *a: tuple(f(*a)) if isinstance(f(*a), tuple) else f(*a)
  with jax.numpy_rank_promotion("raise"):
    out, jvp = jax.jvp(as_tuple(ours), args, tangents)
    grads = jax.grad(lambda *a: sum(jnp.sum(o) for o in jax.tree.leaves(ours(*a))),
                     argnums=tuple(range(len(args))))(*args)
  if name == "qr_pivoted":
    pairs = [jax.jvp(as_tuple(ref), (a,), (t,)) for a, t in zip(args[0], tangents[0])]
    ref_out, ref_jvp = jax.tree.map(lambda *xs: jnp.stack(xs), *pairs) if pairs else (out, jvp)
  else:
    ref_out, ref_jvp = jax.jvp(as_tuple(ref), args, tangents)
  if name == "qr_pivoted":  # Q and R are unique only up to signs of R's diagonal
    out, jvp, ref_out, ref_jvp = (jax.tree.map(jnp.abs, t) for t in (out, jvp, ref_out, ref_jvp))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-7, atol=1e-7),
               (out, jvp), (ref_out, ref_jvp))
  assert all(np.shape(g) == np.shape(a) for g, a in zip(grads, args))


@pytest.mark.parametrize("name", ["qr_wide", "qr_complete_tall", "qr_pivoted", "svd_qr",
                                  "solve_pos", "eigh_upper_no_symmetrize",
                                  "cholesky_no_symmetrize"])
def test_new_derivatives_against_finite_differences(name):
  ours, _, make = GRAD_CASES[name]
  args = make(np.random.default_rng(13), (2,))
  if name.startswith(("eigh", "cholesky")):
    # Differentiate along Hermitian directions, the ones jax's rules cover too.
    f = lambda a: ours((a + jnp.swapaxes(a, -1, -2)) / 2)
  elif name == "solve_pos":
    f = lambda a, b: ours((a + jnp.swapaxes(a, -1, -2)) / 2, b)
  else:
    f = ours
  with jax.numpy_rank_promotion("raise"):
    check_grads(f, args, order=1, modes=("fwd", "rev"), atol=1e-5, rtol=1e-5, eps=1e-6)


def test_one_triangle_derivatives_ignore_the_other_triangle():
  rng = np.random.default_rng(14)
  a = _spd(rng, (4, 4))
  b = rand(rng, (4, 1), np.float64)
  grad = lambda f: np.asarray(jax.grad(lambda a: jnp.sum(f(a) ** 2))(a))
  for f, zero in [(lambda a: bp.linalg.cholesky(a, symmetrize_input=False), np.triu),
                  (lambda a: bp.linalg.eigh(a, lower=False, symmetrize_input=False)[0], np.tril),
                  (lambda a: bp.linalg.solve(a, b, assume_a="pos"), np.tril)]:
    g = grad(f)
    np.testing.assert_array_equal(zero(g, 1 if zero is np.triu else -1), 0)


@pytest.mark.parametrize("implementation", [None, EighImplementation.QR])
def test_eigh_implementations_jax_runs_on_cpu(implementation):
  a = hermitian_pd(np.random.default_rng(5), (3,), 4, np.float64)
  w, v = bp.linalg.eigh(a, implementation=implementation)
  _, want_w = jax.lax.linalg.eigh(a, implementation=implementation)   # (v, w) in lax
  close(w, want_w, np.float64)
  close(w, np.linalg.eigvalsh(a), np.float64)
  close(np.einsum("...ji,...jk,...ki->...i", v, a, v), w, np.float64)


@pytest.mark.parametrize("implementation", [EighImplementation.JACOBI,
                                            EighImplementation.QDWH])
def test_eigh_implementations_jax_lacks_on_cpu_raise_like_jax(implementation):
  a = np.eye(3)
  with pytest.raises(NotImplementedError):
    jax.lax.linalg.eigh(a, implementation=implementation)
  with pytest.raises(NotImplementedError, match="batchpart.linalg.eigh"):
    bp.linalg.eigh(a, implementation=implementation)


def test_eigh_implementation_of_another_type_is_a_value_error():
  with pytest.raises(ValueError, match="implementation must be None or a"):
    bp.linalg.eigh(np.eye(3), implementation="qr")
