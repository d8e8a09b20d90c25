"""How a kernel or a callback learns the global start of its part along a
reduced dim: pass the positions as an operand with that dim
(``jnp.arange(n)``). It is split like every operand with the dim, so each
device's kernel sees the global positions of its own part (the first is
its part's start); XLA computes each part of the iota where it is needed,
with no collective. The same operand along a batch dim gives the global
batch positions."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import batchpart as bp
from batchpart import _hlo, testing as kernels

from helpers import local_shapes, put, the_custom_call


def test_an_ffi_kernel_sees_the_global_positions_of_its_part(partitioner, mesh2x4):
  x = np.ones((4, 64, 1), np.float32)

  def f(x):
    positions = jnp.broadcast_to(jnp.arange(64, dtype=jnp.float32), x.shape[:-1])
    # row[i] = w[i] * sum_j x[i, j] = the global position of row i.
    return kernels.weigh_rows(x, positions)

  xs = put(x, mesh2x4, P("a", "b"))
  total, row = jax.jit(f)(xs)
  np.testing.assert_array_equal(np.asarray(row), np.broadcast_to(np.arange(64), (4, 64)))
  np.testing.assert_array_equal(np.asarray(total), np.full((4, 1), 64 * 63 / 2))
  text = jax.jit(f).lower(xs).compile().as_text()
  assert local_shapes(the_custom_call(text, "batchpart_test_weigh_rows")) == [(2, 16, 1),
                                                                              (2, 16)]
  assert {c.opcode for c in _hlo.collectives(text)} == {"all-reduce"}


def _weighted_by_position(x, positions):
  return (x * positions).sum(-1)


def test_a_callback_sees_the_global_positions_of_its_part(partitioner, mesh2x4):
  x = np.random.default_rng(0).standard_normal((4, 64))

  def f(x):
    positions = jnp.broadcast_to(jnp.arange(64, dtype=x.dtype), x.shape)
    return bp.pure_callback(_weighted_by_position, jax.ShapeDtypeStruct((4,), x.dtype),
                            x, positions, signature="(n),(n)->()", reduce={"n": "sum"})

  with jax.enable_x64(True):
    xs = put(x, mesh2x4, P("a", "b"))
    out = jax.jit(f)(xs)
    text = jax.jit(f).lower(xs).compile().as_text()
  np.testing.assert_allclose(np.asarray(out), (x * np.arange(64)).sum(-1), rtol=1e-12)
  assert "all-gather" not in {c.opcode for c in _hlo.collectives(text)}


def test_with_index_gives_a_callback_its_part_of_the_reduced_dim(partitioner, mesh2x4):
  """``index`` holds the batch block's slices, then the part of each reduced
  dim: the global positions of the callback's elements."""
  seen = []

  def weighted(x, *, index):
    seen.append(tuple((s.start, s.stop) for s in index))
    return (x * np.arange(index[-1].start, index[-1].stop)).sum(-1).astype(x.dtype)

  x = np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)
  f = jax.jit(lambda x: bp.pure_callback(weighted, jax.ShapeDtypeStruct((4,), np.float32), x,
                                         signature="(n)->()", reduce={"n": "sum"},
                                         with_index=True))
  out = f(put(x, mesh2x4, P("a", "b")))
  np.testing.assert_allclose(np.asarray(out), (x * np.arange(64)).sum(-1), rtol=1e-5,
                             atol=1e-4)
  assert sorted(set(seen)) == [((b, b + 2), (n, n + 16)) for b in (0, 2)
                               for n in (0, 16, 32, 48)]
  seen.clear()
  f(x)   # one device holds everything: the whole dim
  assert seen == [((0, 4), (0, 64))] or all(s[1] == (0, 64) for s in seen)
