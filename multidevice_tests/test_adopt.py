"""Existing primitives made batch partitionable: a package-style primitive
through bp.ffi_lowering, jax-finufft through bp.partition_primitive, and
jnp.linalg through partition_primitive on jax.lax.linalg's primitives (in a
subprocess: wrapping jax's own primitives is process-wide)."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.interpreters import mlir
from jax.sharding import AxisType, PartitionSpec as P

import batchpart as bp
from batchpart import _compat as compat, testing as kernels

from helpers import collective_kinds, local_shapes, put, the_custom_call, warm_up_jax_finufft

HERE = os.path.dirname(__file__)


def _axpy_primitive():
  """axpy whose alpha attribute each shard rewrites to its local batch size,
  so the result shows which batch each device saw."""
  p = compat.Primitive("adopt_axpy_local_alpha")
  p.def_abstract_eval(lambda x, y, **_: compat.ShapedArray(x.shape, x.dtype))
  mlir.register_lowering(p, bp.ffi_lowering(
      "batchpart_test_axpy", num_batch_dims=1,
      shard_attributes=lambda attrs, batch: {"alpha": np.float64(batch[0])}))
  return p


_AXPY = _axpy_primitive()


def _softmax_primitive():
  p = compat.Primitive("adopt_softmax_md")
  p.multiple_results = True
  p.def_abstract_eval(lambda x: (compat.ShapedArray(x.shape, x.dtype),
                                 compat.ShapedArray(x.shape[:-1], x.dtype)))
  mlir.register_lowering(p, jax.ffi.ffi_lowering("batchpart_test_softmax"))
  return bp.partition_primitive(p, signature="(n)->(n),()")


_SOFTMAX = _softmax_primitive()


def test_adopted_primitive_batch_and_core_sharded(partitioner, mesh8):
  x = np.random.default_rng(0).standard_normal((64, 16)).astype(np.float32)
  for spec in (P("x"), P(None, "x")):
    text = jax.jit(_SOFTMAX.bind).lower(put(x, mesh8, spec)).compile().as_text()
    assert local_shapes(the_custom_call(text, "batchpart_test_softmax")) == [(8, 16)]
    assert "all-gather" not in collective_kinds(text) or spec == P(None, "x")
    y, _ = jax.jit(_SOFTMAX.bind)(put(x, mesh8, spec))
    np.testing.assert_allclose(y, kernels.softmax_reference(x)[0], rtol=1e-5, atol=1e-6)
  text = jax.jit(_SOFTMAX.bind).lower(put(x, mesh8, P("x"))).compile().as_text()
  assert collective_kinds(text) == set()


def test_shard_attributes_see_the_local_batch(partitioner, mesh8):
  x = np.ones((16, 4), np.float32)
  y = np.zeros((16, 4), np.float32)
  f = jax.jit(lambda x, y: _AXPY.bind(x, y, alpha=np.float64(1.0)))
  out = f(put(x, mesh8, P("x")), put(y, mesh8, P("x")))
  np.testing.assert_array_equal(out, np.full((16, 4), 2.0))   # 2 rows per device
  # Not partitioned (one device): the attributes as the lowering gave them.
  np.testing.assert_array_equal(f(x, y), np.full((16, 4), 1.0))


def test_explicit_mode_results_are_batch_sharded():
  mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Explicit,))
  x = np.random.default_rng(1).standard_normal((16, 8)).astype(np.float32)
  with jax.set_mesh(mesh):
    xs = jax.device_put(x, P("x"))
    y, lse = jax.jit(_SOFTMAX.bind)(xs)
    assert jax.typeof(y).sharding.spec == P("x", None)
    text = jax.jit(_SOFTMAX.bind).lower(xs).compile().as_text()
  assert collective_kinds(text) == set()
  np.testing.assert_allclose(y, kernels.softmax_reference(x)[0], rtol=1e-5, atol=1e-6)


# ---- jax-finufft, unchanged -------------------------------------------------------

finufft = pytest.importorskip("jax_finufft")


def _n_tot(attrs, batch):
  return {"n_tot": np.int64(np.prod(batch))}


@pytest.fixture(scope="module")
def partitioned_finufft():
  from jax_finufft import ops
  warm_up_jax_finufft()
  primitives = (ops.nufft1_p, ops.nufft2_p, ops.nufft3_p)
  for p in primitives:
    bp.partition_primitive(p, num_batch_dims=1, shard_attributes=_n_tot)
  yield finufft
  for p in primitives:   # later modules declare these primitives their own way
    bp.unpartition(p)


def _points(seed, shape=(16, 500)):
  r = np.random.default_rng(seed)
  x = r.uniform(-np.pi, np.pi, shape)
  c = r.standard_normal(shape) + 1j * r.standard_normal(shape)
  return c.astype(np.complex64), x.astype(np.float32)


def test_nufft1_batch_sharded_runs_per_shard(partitioner, mesh8, partitioned_finufft):
  c, x = _points(0)
  f = jax.jit(lambda c, x: partitioned_finufft.nufft1(64, c, x))
  want = np.asarray(f(c, x))
  cs, xs = put(c, mesh8, P("x")), put(x, mesh8, P("x"))
  text = f.lower(cs, xs).compile().as_text()
  assert collective_kinds(text) == set()
  (call,) = [i for i in __import__("batchpart")._hlo.custom_calls(text)
             if i.target.startswith("nufft1d1")]
  assert local_shapes(call) == [(2, 1, 500), (2, 500)]
  np.testing.assert_allclose(f(cs, xs), want, rtol=1e-5, atol=1e-4)


def test_nufft2_and_grad_sharded_equal_unsharded(partitioner, mesh8, partitioned_finufft):
  c, x = _points(1)
  f = jnp.asarray(np.random.default_rng(2).standard_normal((16, 64)) + 0j, jnp.complex64)

  def loss(f, x):
    return jnp.sum(jnp.abs(partitioned_finufft.nufft2(f, x)) ** 2)

  vg = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
  want = vg(f, x)
  got = vg(put(np.asarray(f), mesh8, P("x")), put(x, mesh8, P("x")))
  np.testing.assert_allclose(got[0], want[0], rtol=1e-4)
  for g, w in zip(got[1], want[1]):
    np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-3 * np.abs(w).max())


@pytest.fixture
def finufft_batching_alias(monkeypatch):
  """jax-finufft 1.3.1's own batching rule reads ``batching.not_mapped``,
  which jax 0.10 no longer has (unmapped axes are None): without the alias
  its vmap fails with or without batchpart."""
  from jax._src.interpreters import batching
  if not hasattr(batching, "not_mapped"):
    monkeypatch.setattr(batching, "not_mapped", None, raising=False)


def test_nufft1_vmap(mesh8, partitioned_finufft, finufft_batching_alias):
  c, x = _points(3, (4, 16, 100))
  f = jax.jit(jax.vmap(lambda c, x: partitioned_finufft.nufft1(32, c, x)))
  want = np.stack([np.asarray(partitioned_finufft.nufft1(32, c[i], x[i]))
                   for i in range(4)])
  np.testing.assert_allclose(f(c, x), want, rtol=1e-4, atol=1e-4)
  got = f(put(c, mesh8, P(None, "x")), put(x, mesh8, P(None, "x")))
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


# ---- jnp.linalg -------------------------------------------------------------------

@pytest.mark.timeout(600)
@pytest.mark.parametrize("partitioner_name", ["shardy", "gspmd"])
def test_jnp_linalg_through_partition_primitive(partitioner_name):
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  proc = subprocess.run(
      [sys.executable, os.path.join(HERE, "adopt_linalg_worker.py"), partitioner_name],
      capture_output=True, text=True, timeout=540, env=env)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert "ALL OK" in proc.stdout, proc.stdout[-3000:]
