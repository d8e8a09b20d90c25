"""Derivatives of batchpart.linalg: equal to jax.numpy.linalg's and to finite
differences, forward and reverse mode."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import batchpart as bp

# The float64 and complex128 cases need jax's 64-bit types.
pytestmark = pytest.mark.usefixtures("x64")

rng = np.random.default_rng(0)


def rand(shape, dtype=np.float64):
  x = rng.standard_normal(shape)
  if np.issubdtype(dtype, np.complexfloating):
    x = x + 1j * rng.standard_normal(shape)
  return x.astype(dtype)


def spd(batch, n, dtype=np.float64):
  x = rand((*batch, n, n), dtype)
  return x @ np.conj(np.swapaxes(x, -1, -2)) + n * np.eye(n)


def loss_pairs():
  """(name, batchpart function, jax reference, argument maker)."""
  sym = lambda a: (a + np.conj(np.swapaxes(a, -1, -2))) / 2
  return [
      ("cholesky", lambda a: bp.linalg.cholesky(a), lambda a: jnp.linalg.cholesky(a),
       lambda dt: (spd((2,), 4, dt),)),
      ("cholesky_upper", lambda a: bp.linalg.cholesky(a, lower=False),
       lambda a: jnp.linalg.cholesky(a, upper=True), lambda dt: (spd((2,), 3, dt),)),
      ("lu", lambda a: bp.linalg.lu(a)[0], lambda a: jax.lax.linalg.lu(a)[0],
       lambda dt: (rand((2, 4, 4), dt),)),
      ("lu_wide", lambda a: bp.linalg.lu(a)[0], lambda a: jax.lax.linalg.lu(a)[0],
       lambda dt: (rand((2, 3, 5), dt),)),
      ("qr", lambda a: bp.linalg.qr(a), lambda a: jnp.linalg.qr(a),
       lambda dt: (rand((2, 5, 3), dt),)),
      ("eigh", lambda a: bp.linalg.eigh(a)[0], lambda a: jnp.linalg.eigh(a)[0],
       lambda dt: (sym(rand((2, 4, 4), dt)),)),
      ("eigh_vectors_abs", lambda a: jnp.abs(bp.linalg.eigh(a)[1]),
       lambda a: jnp.abs(jnp.linalg.eigh(a)[1]), lambda dt: (sym(rand((2, 4, 4), dt)),)),
      ("svd_values", lambda a: bp.linalg.svd(a, compute_uv=False),
       lambda a: jnp.linalg.svd(a, compute_uv=False), lambda dt: (rand((2, 4, 3), dt),)),
      ("svd_reconstruct", lambda a: _usv(bp.linalg.svd(a)),
       lambda a: _usv(jnp.linalg.svd(a, full_matrices=False)), lambda dt: (rand((2, 3, 4), dt),)),
      ("triangular_solve",
       lambda a, b: bp.linalg.triangular_solve(a, b, lower=True),
       lambda a, b: jax.lax.linalg.triangular_solve(a, b, left_side=True, lower=True),
       lambda dt: (rand((2, 3, 3), dt) + 3 * np.eye(3), rand((2, 3, 2), dt))),
      ("triangular_solve_right_T",
       lambda a, b: bp.linalg.triangular_solve(a, b, left_side=False, lower=False,
                                               transpose_a=True),
       lambda a, b: jax.lax.linalg.triangular_solve(a, b, left_side=False, lower=False,
                                                    transpose_a=True),
       lambda dt: (rand((2, 3, 3), dt) + 3 * np.eye(3), rand((2, 4, 3), dt))),
      ("solve", lambda a, b: bp.linalg.solve(a, b), lambda a, b: jnp.linalg.solve(a, b),
       lambda dt: (rand((2, 3, 3), dt) + 3 * np.eye(3), rand((2, 3, 2), dt))),
      ("solve_vector", lambda a, b: bp.linalg.solve(a, b), lambda a, b: jnp.linalg.solve(a, b),
       lambda dt: (rand((2, 3, 3), dt) + 3 * np.eye(3), rand((3,), dt))),
  ]


def _usv(usv):
  u, s, vh = usv
  return (u * s[..., None, :]) @ vh


@pytest.mark.parametrize("name,ours,ref,make", loss_pairs(), ids=[p[0] for p in loss_pairs()])
@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
def test_jvp_and_vjp_match_jax(name, ours, ref, make, dtype):
  args = make(dtype)
  tangents = tuple(rand(np.shape(a), dtype) for a in args)
  if name.startswith("cholesky") or name.startswith("eigh"):
    tangents = tuple((t + np.conj(np.swapaxes(t, -1, -2))) / 2 for t in tangents)
  as_tuple = lambda f: lambda *a: tuple(f(*a)) if isinstance(f(*a), tuple) else f(*a)
  ours, ref = as_tuple(ours), as_tuple(ref)
  out, jvp = jax.jvp(ours, args, tangents)
  ref_out, ref_jvp = jax.jvp(ref, args, tangents)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-8, atol=1e-8),
               (out, jvp), (ref_out, ref_jvp))
  ct = jax.tree.map(lambda o: rand(np.shape(o), np.asarray(o).dtype), out)
  vjp = jax.vjp(ours, *args)[1](ct)
  ref_vjp = jax.vjp(ref, *args)[1](ct)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-7, atol=1e-7),
               vjp, ref_vjp)


@pytest.mark.parametrize("name,ours,ref,make", loss_pairs(), ids=[p[0] for p in loss_pairs()])
def test_against_finite_differences(name, ours, ref, make):
  args = make(np.float64)
  if name.startswith(("cholesky", "eigh")):
    f = lambda a, *rest: ours((a + jnp.swapaxes(a, -1, -2)) / 2, *rest)
  else:
    f = ours
  check_grads(f, args, order=1, modes=("fwd", "rev"), atol=1e-5, rtol=1e-5, eps=1e-6)


@pytest.mark.parametrize("name,ours,ref,make", loss_pairs(), ids=[p[0] for p in loss_pairs()])
def test_derivatives_use_only_batchpart_kernels(name, ours, ref, make):
  """jaxlib's CPU LAPACK kernels can deadlock XLA's pool on several devices
  (docs/reliability.md): no derivative of batchpart.linalg may call them."""
  args = make(np.float64)
  loss = lambda *a: jnp.sum(jnp.abs(jnp.asarray(jax.tree.leaves(ours(*a))[0])) ** 2)
  text = jax.jit(jax.grad(loss, argnums=tuple(range(len(args))))).lower(*args).as_text()
  targets = set(re.findall(r'stablehlo.custom_call @"?(\w+)', text))
  assert targets and all(t.startswith("batchpart_") for t in targets), targets
