"""batchpart.linalg on 8 simulated devices, against jnp.linalg and NumPy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg
from jax.lax.linalg import SvdAlgorithm
from jax.sharding import AxisType, PartitionSpec as P

import batchpart as bp

from helpers import collective_kinds, compiled_text, local_shapes, put, rng, the_custom_call


def spd(batch, n, seed=0):
  x = rng(seed).standard_normal((*batch, n, n)).astype(np.float32)
  return x @ np.swapaxes(x, -1, -2) + n * np.eye(n, dtype=np.float32)


CASES = {
    "cholesky": (lambda a: bp.linalg.cholesky(a), "batchpart_potrf",
                 lambda a: np.linalg.cholesky(a)),
    "eigh": (lambda a: bp.linalg.eigh(a)[0], "batchpart_eigh",
             lambda a: np.linalg.eigvalsh(a)),
    "svd": (lambda a: bp.linalg.svd(a, compute_uv=False), "batchpart_svd",
            lambda a: np.linalg.svd(a, compute_uv=False)),
    "qr_r": (lambda a: jnp.abs(bp.linalg.qr(a, mode="r")), "batchpart_qr_row_major",
             lambda a: np.abs(np.linalg.qr(a, mode="r"))),
    "lu": (lambda a: bp.linalg.lu(a)[0], "batchpart_getrf_row_major",
           lambda a: np.asarray(jax.lax.linalg.lu(a)[0])),
    "solve": (lambda a: bp.linalg.solve(a, a[..., :, :2]), "batchpart_gesv_row_major",
              lambda a: np.linalg.solve(a, a[..., :, :2])),
    "triangular_solve": (lambda a: bp.linalg.triangular_solve(a, a[..., :, :2]),
                         "batchpart_trsm_row_major",
                         lambda a: np.asarray(jax.lax.linalg.triangular_solve(
                             a, a[..., :, :2], left_side=True, lower=True))),
    # The options with CPU-only targets.
    "qr_pivoted": (lambda a: jnp.abs(bp.linalg.qr(a, mode="r", pivoting=True)[0]),
                   "batchpart_geqp3",
                   lambda a: np.stack([np.abs(scipy.linalg.qr(x, mode="r", pivoting=True)[0])
                                       for x in a])),
    "qr_raw": (lambda a: jnp.abs(bp.linalg.qr(a, mode="raw")[1]), "batchpart_geqrf",
               lambda a: np.stack([np.abs(np.linalg.qr(x, mode="raw")[1]) for x in a])),
    "svd_qr": (lambda a: bp.linalg.svd(a, compute_uv=False, algorithm=SvdAlgorithm.QR),
               "batchpart_gesvd", lambda a: np.linalg.svd(a, compute_uv=False)),
    "solve_pos": (lambda a: bp.linalg.solve(a, a[..., :, :2], assume_a="pos"), "batchpart_posv",
                  lambda a: np.linalg.solve(a, a[..., :, :2])),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_batch_sharded_no_collectives(partitioner, mesh8, name):
  f, target, ref = CASES[name]
  a = spd((16,), 8)
  x = put(a, mesh8, P("x"))
  text = compiled_text(f, x)
  assert collective_kinds(text) == set()
  assert local_shapes(the_custom_call(text, target))[0] == (2, 8, 8)
  np.testing.assert_allclose(jax.jit(f)(x), ref(a), rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("name", ["cholesky", "eigh", "svd"])
def test_core_sharded_splits_work(partitioner, mesh8, name):
  f, target, ref = CASES[name]
  a = spd((64,), 16)
  x = put(a, mesh8, P(None, "x"))
  call = the_custom_call(compiled_text(f, x), target)
  assert local_shapes(call)[0] == (8, 16, 16)  # 1/8 of the batch, whole matrices
  np.testing.assert_allclose(jax.jit(f)(x), ref(a), rtol=2e-3, atol=2e-3)
  # jnp.linalg runs the whole batch on every device here.
  jnp_text = compiled_text(jnp.linalg.cholesky, x)
  assert any(t.shape == (64, 16, 16) for c in __import__("batchpart")._hlo.custom_calls(jnp_text)
             for t in c.operand_types)


def test_explicit_mesh_works_and_stays_sharded(partitioner):
  mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Explicit,))
  a = spd((16,), 4)
  with jax.set_mesh(mesh):
    x = put(a, mesh, P("x"))
    factor = jax.jit(bp.linalg.cholesky)(x)
    assert jax.typeof(factor).sharding.spec == P("x", None, None)
    assert collective_kinds(compiled_text(bp.linalg.cholesky, x)) == set()
  np.testing.assert_allclose(factor, np.linalg.cholesky(a), rtol=1e-4, atol=1e-4)


def test_non_pd_element_is_nan_rest_correct(partitioner, mesh8):
  a = spd((16,), 4)
  a[5] = -np.eye(4)
  factor = np.asarray(jax.jit(bp.linalg.cholesky)(put(a, mesh8, P("x"))))
  assert np.isnan(factor[5]).all()
  keep = [i for i in range(16) if i != 5]
  np.testing.assert_allclose(factor[keep], np.linalg.cholesky(a[keep]), rtol=1e-4, atol=1e-4)


def test_uneven_batch_padding_never_fails(partitioner, mesh8):
  a = spd((16,), 4)
  f = jax.jit(lambda a: bp.linalg.cholesky(a[:11]))
  np.testing.assert_allclose(f(put(a, mesh8, P("x"))), np.linalg.cholesky(a[:11]),
                             rtol=1e-4, atol=1e-4)


def test_broadcast_solve_operand(partitioner, mesh8):
  a = spd((), 4)
  b = rng(3).standard_normal((16, 4, 2)).astype(np.float32)
  args = put(a, mesh8, P()), put(b, mesh8, P("x"))
  text = compiled_text(bp.linalg.solve, *args)
  assert collective_kinds(text) == set()
  assert local_shapes(the_custom_call(text, "batchpart_gesv_row_major")) == [(4, 4), (2, 4, 2)]
  np.testing.assert_allclose(jax.jit(bp.linalg.solve)(*args), np.linalg.solve(a, b),
                             rtol=1e-4, atol=1e-4)


def test_grad_under_sharding(partitioner, mesh8):
  a = spd((16,), 4)
  x = put(a, mesh8, P("x"))
  g = jax.jit(jax.grad(lambda a: bp.linalg.cholesky(a).sum()))(x)
  ref = jax.grad(lambda a: jnp.linalg.cholesky(a).sum())(a)
  np.testing.assert_allclose(g, ref, rtol=1e-3, atol=1e-3)
