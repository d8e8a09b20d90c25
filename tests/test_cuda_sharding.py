"""batchpart on one CUDA GPU: calls inside ``jax.shard_map`` over a one-GPU
mesh, a jit over a ``NamedSharding`` on it, host and buffer callbacks on GPU
operands, and ``bp.explain`` of a GPU program. Skipped without a GPU.

Several GPUs are not available to the tests: the partitioner's per-device
programs are checked on simulated CPU devices (multidevice_tests/), and here
that the same calls run on a GPU with the GPU's own handlers and targets."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import batchpart as bp
from batchpart import _cusolver_targets
from batchpart.testing import hermitian_pd as hpd

S = jax.ShapeDtypeStruct

pytestmark = pytest.mark.skipif(not _cusolver_targets.has_cuda_devices(), reason="no GPU")


@pytest.fixture
def mesh():
  return Mesh(np.array(jax.devices("cuda")[:1]), ("x",))


@pytest.fixture
def cuda_kernels():
  if not _cusolver_targets.available():
    pytest.skip("batchpart._cuda was not built")
  assert _cusolver_targets.register()


def test_linalg_inside_shard_map_over_one_gpu(mesh, cuda_kernels):
  a = hpd(np.random.default_rng(0), (6,), 5, np.float32)
  f = jax.jit(jax.shard_map(lambda a: (bp.linalg.cholesky(a), bp.linalg.eigh(a)[0]),
                            mesh=mesh, in_specs=P("x"), out_specs=P("x")))
  chol, w = f(jax.device_put(a, NamedSharding(mesh, P("x"))))
  assert all(d.platform == "gpu" for d in chol.devices())
  np.testing.assert_allclose(chol, np.linalg.cholesky(a), rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(w, np.linalg.eigvalsh(a), rtol=1e-4, atol=1e-4)


def test_linalg_on_a_batch_sharded_gpu_array(mesh, cuda_kernels):
  a = hpd(np.random.default_rng(1), (4, 3), 6, np.float32)
  b = np.random.default_rng(2).standard_normal((4, 3, 6, 2)).astype(np.float32)
  sharding = NamedSharding(mesh, P("x"))
  f = jax.jit(bp.linalg.solve)
  x = f(jax.device_put(a, sharding), jax.device_put(b, sharding))
  assert x.sharding.is_equivalent_to(sharding, x.ndim)
  np.testing.assert_allclose(x, np.linalg.solve(a, b), rtol=1e-3, atol=1e-3)
  text = f.lower(jax.device_put(a, sharding), jax.device_put(b, sharding)).compile().as_text()
  assert "batchpart_gesv" in text


def test_explain_reads_a_gpu_program(mesh, cuda_kernels):
  a = jax.device_put(hpd(np.random.default_rng(3), (8,), 4, np.float32),
                     NamedSharding(mesh, P("x")))
  report = bp.explain(jax.jit(bp.linalg.cholesky), a)
  (call,) = report.calls
  assert call.target.startswith("batchpart_potrf")
  assert call.device_operand_shapes == ((8, 4, 4),)
  assert call.collectives_before == () and call.collectives_after == ()


@pytest.mark.parametrize("arrays", ["numpy", "jax"])
def test_pure_callback_on_gpu_operands(mesh, arrays):
  x = np.random.default_rng(4).standard_normal((16, 3)).astype(np.float32)
  seen = []

  def f(v):
    seen.append((isinstance(v, jax.Array), v.shape))
    return np.asarray(np.sin(np.asarray(v)).sum(-1), np.float32)

  call = lambda v: bp.pure_callback(f, S((16,), np.float32), v, num_batch_dims=1,
                                    arrays=arrays)
  y = jax.jit(call)(jax.device_put(x, jax.devices("cuda")[0]))
  np.testing.assert_allclose(y, np.sin(x).sum(-1), rtol=1e-5)
  assert seen == [(arrays == "jax", (16, 3))]
  # and per shard inside shard_map, composed with device work around it
  g = jax.jit(jax.shard_map(lambda v: 2 * bp.pure_callback(
      f, S((16,), np.float32), jnp.cos(v), num_batch_dims=1, arrays=arrays),
      mesh=mesh, in_specs=P("x"), out_specs=P("x")))
  np.testing.assert_allclose(g(x), 2 * np.sin(np.cos(x)).sum(-1), rtol=1e-5)


def test_buffer_callback_works_on_the_device_on_the_call_stream(mesh):
  cupy = pytest.importorskip("cupy")

  def scale(ctx, out, x):
    assert int(ctx.stream) != 0  # XLA's stream for this call, not the default one
    with cupy.cuda.ExternalStream(ctx.stream):
      cupy.multiply(cupy.asarray(x), 2, out=cupy.asarray(out))

  x = np.arange(24, dtype=np.float32).reshape(8, 3)
  f = bp.buffer_callback(scale, S((8, 3), np.float32), num_batch_dims=1)
  # device work before and after it on the same stream sees its result
  g = jax.jit(lambda v: f(v + 1) - 1)
  np.testing.assert_array_equal(g(jax.device_put(x, jax.devices("cuda")[0])), 2 * x + 1)
  h = jax.jit(jax.shard_map(lambda v: f(v + 1) - 1, mesh=mesh, in_specs=P("x"),
                            out_specs=P("x")))
  np.testing.assert_array_equal(h(x), 2 * x + 1)
