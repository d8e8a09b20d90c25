"""The decorator on 8 devices: a shared operand of the wrapper (transformed or
not, inside jits and custom-derivative rules) is passed whole to every shard
while the batch is split; calls with nothing batched stay plain; custom_vmap
bodies are partitioned. Checked on the compiled HLO (per-device shapes, no
gather before the call), the values against NumPy, and the kernels' count of
batch elements (each computed exactly once, counted once the results are
ready)."""

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import batchpart as bp
from batchpart import _hlo, testing as kernels

from helpers import collective_kinds, compiled_text, local_shapes, put

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import test_decorator as wrappers  # noqa: E402  (the one-device tests' wrappers)

MATVEC, SOFTMAX = "batchpart_test_matvec", "batchpart_test_softmax"


def _calls(text, target):
  return _hlo.custom_calls(text, target)


def _assert_split_batch_whole_matrix(text):
  """Each device's matvec gets the whole (8, 5) matrix and one batch vector,
  and nothing is gathered or shuffled to feed it."""
  calls = _calls(text, MATVEC)
  assert calls and all(local_shapes(c) == [(8, 5), (1, 5)] for c in calls), [
      local_shapes(c) for c in calls]
  assert not collective_kinds(text) & {"all-gather", "all-to-all"}, collective_kinds(text)


def _operands(mesh8):
  w = wrappers.w_np()
  x = np.random.default_rng(11).standard_normal((8, 5)).astype(np.float32)
  return w, x, put(w, mesh8, P()), put(x, mesh8, P("x"))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("variant", sorted(wrappers.SHARED))
def test_transformed_shared_matrix_is_passed_whole(partitioner, mesh8, variant):
  g = bp.batch_partitionable(wrappers.SHARED[variant], signature="(m,n),(n)->(m)")
  w, x, ws, xs = _operands(mesh8)
  _assert_split_batch_whole_matrix(compiled_text(g, ws, xs))
  kernels.reset_batch_elements_processed()
  out = jax.block_until_ready(jax.jit(g)(ws, xs))
  np.testing.assert_allclose(np.asarray(out), x @ (2 * w).T, rtol=1e-5, atol=1e-5)
  assert kernels.batch_elements_processed() == 8   # each vector once, on one device


@pytest.mark.timeout(300)
def test_shared_matrix_inside_custom_vjp_forward_and_grad(partitioner, mesh8):
  g = bp.batch_partitionable(wrappers._matvec_with_vjp(), signature="(m,n),(n)->(m)")
  w, x, ws, xs = _operands(mesh8)
  value_and_grad = jax.value_and_grad(lambda w, x: jnp.sum(g(w, x) ** 2), (0, 1))
  _assert_split_batch_whole_matrix(compiled_text(value_and_grad, ws, xs))
  kernels.reset_batch_elements_processed()
  value, (gw, gx) = jax.block_until_ready(jax.jit(value_and_grad)(ws, xs))
  assert kernels.batch_elements_processed() == 8
  y = x @ w.T
  np.testing.assert_allclose(value, np.sum(y ** 2), rtol=1e-4)
  np.testing.assert_allclose(np.asarray(gw), 2 * y.T @ x, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(np.asarray(gx), 2 * y @ w, rtol=1e-4, atol=1e-4)


@pytest.mark.timeout(300)
def test_custom_jvp_rule_with_shared_tangent(partitioner, mesh8):
  """The JVP rule's kernels on (w, tx) and (tw, x): the tangent of the shared
  matrix is shared too."""
  g = bp.batch_partitionable(wrappers._matvec_with_jvp(), signature="(m,n),(n)->(m)")
  w, x, ws, xs = _operands(mesh8)
  tw, tx = np.ones_like(w), np.full_like(x, 0.5)
  jvp = lambda w, x, tw, tx: jax.jvp(g, (w, x), (tw, tx))   # noqa: E731
  args = (ws, xs, put(tw, mesh8, P()), put(tx, mesh8, P("x")))
  _assert_split_batch_whole_matrix(compiled_text(jvp, *args))
  kernels.reset_batch_elements_processed()
  y, t = jax.block_until_ready(jax.jit(jvp)(*args))
  assert kernels.batch_elements_processed() == 3 * 8
  np.testing.assert_allclose(np.asarray(y), x @ w.T, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(t), tx @ w.T + x @ tw.T, rtol=1e-5, atol=1e-5)


@pytest.mark.timeout(300)
def test_call_with_only_shared_operands_runs_plain(partitioner, mesh8):
  """The shared table's softmax has the batch shape but nothing batched: it
  stays a plain call (every device runs it whole), while the batched call is
  split."""
  @bp.batch_partitionable(signature="(n),(m,n)->(n)")
  def f(x, table):
    return wrappers._plain_softmax(x)[0] + wrappers._plain_softmax(table * 2.0)[0]

  rng = np.random.default_rng(12)
  x = rng.standard_normal((8, 6)).astype(np.float32)
  table = rng.standard_normal((8, 6)).astype(np.float32)
  xs, ts = put(x, mesh8, P("x")), put(table, mesh8, P())
  shapes = sorted(local_shapes(c)[0] for c in _calls(compiled_text(f, xs, ts), SOFTMAX))
  assert shapes == [(1, 6), (8, 6)]
  kernels.reset_batch_elements_processed()
  out = jax.block_until_ready(jax.jit(f)(xs, ts))
  assert kernels.batch_elements_processed() == 8 + 8 * 8   # split once; whole on each
  want = kernels.softmax_reference(x)[0] + kernels.softmax_reference(2 * table)[0]
  np.testing.assert_allclose(np.asarray(out), want, rtol=1e-5, atol=1e-6)


@pytest.mark.timeout(300)
def test_custom_vmap_body_is_partitioned(partitioner, mesh8):
  g = bp.batch_partitionable(wrappers._softmax_with_custom_vmap(), signature="(n)->(n)")
  x = np.random.default_rng(13).standard_normal((8, 6)).astype(np.float32)
  xs = put(x, mesh8, P("x"))
  text = compiled_text(g, xs)
  (call,) = _calls(text, SOFTMAX)
  assert local_shapes(call) == [(1, 6)]
  assert not collective_kinds(text) & {"all-gather", "all-to-all"}
  kernels.reset_batch_elements_processed()
  out = jax.block_until_ready(jax.jit(g)(xs))
  assert kernels.batch_elements_processed() == 8
  np.testing.assert_allclose(np.asarray(out), kernels.softmax_reference(x)[0],
                             rtol=1e-5, atol=1e-6)
