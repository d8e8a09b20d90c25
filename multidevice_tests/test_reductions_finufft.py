"""jax-finufft with its points sharded, through bp.partition_primitive with
reduce=: a type 1 (points -> grid) sums over its points, so each device
transforms its own points and one all-reduce combines the grids; a type 2
(grid -> points) is independent per point; the gradient of a type 2 with
respect to its grid is a type 1 over the same points. Both partitioners,
complex128."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import batchpart as bp
from batchpart import _hlo

from helpers import local_shapes, put, warm_up_jax_finufft

finufft = pytest.importorskip("jax_finufft")

N, M = 4000, 32   # points (8 x 500), grid M x M
# FINUFFT's default upsampfac (0) picks the upsampling factor from the point
# density, so a device's 500 points may be transformed with another factor
# than all 4000: the sum of the parts is then within FINUFFT's eps of the
# whole, not equal to it up to rounding. Pinned, the parts sum to the whole.
OPTS = finufft.options.Opts(upsampfac=2.0)


@pytest.fixture(autouse=True)
def x64():
  with jax.enable_x64(True):
    yield


def _type1(attrs, batch, core):
  return {"n_tot": np.int64(np.prod(batch)), "n_j": np.int64(core["j"])}


def _type2(attrs, batch):
  return {"n_j": np.int64(np.prod(batch))}


@pytest.fixture
def reduced_finufft():
  """2-D type 1 with its points (j) reduced, type 2 with its points a batch
  dim behind a ``...``, as jax-finufft emits them: type 1 operands
  (n_tot, n_transf, n_j) and the points reversed, each (n_tot, n_j), result
  (n_tot, n_transf, m, k); type 2 operands (n_tot, n_transf, m, k) and the
  points, result (n_tot, n_transf, n_j)."""
  from jax_finufft import ops
  warm_up_jax_finufft()
  declared = {ops.nufft1_p: dict(signature="(T,j),(j),(j)->(T,m,k)", reduce={"j": "sum"},
                                 shard_attributes=_type1),
              ops.nufft2_p: dict(signature="(t,T,m,k),(t,...),(t,...)->(t,T,...)",
                                 shard_attributes=_type2)}
  for p, declaration in declared.items():
    try:
      bp.partition_primitive(p, **declaration)
    except ValueError:
      # Another declaration left in force (test_adopt.py's module fixture
      # declares the jax-finufft primitives batch-only and keeps them).
      bp.unpartition(p)
      bp.partition_primitive(p, **declaration)
  yield finufft
  for p in declared:
    bp.unpartition(p)


def _data(seed, n=N, batch=()):
  r = np.random.default_rng(seed)
  x, y = (r.uniform(-np.pi, np.pi, (*batch, n)) for _ in range(2))
  c = r.standard_normal((*batch, n)) + 1j * r.standard_normal((*batch, n))
  f = r.standard_normal((M, M)) + 1j * r.standard_normal((M, M))
  return c, x, y, f


def _n_j(call) -> int:
  return int(re.search(r"\bn_j = (\d+) : i64", call.text).group(1))


def _close(got, want, rtol=1e-6):
  want = np.asarray(want)
  np.testing.assert_allclose(np.asarray(got), want, rtol=rtol, atol=rtol * np.abs(want).max())


def test_type1_points_sharded_equals_unsharded(partitioner, mesh8, reduced_finufft):
  c, x, y, _ = _data(0)
  f = jax.jit(lambda c, x, y: reduced_finufft.nufft1((M, M), c, x, y, opts=OPTS))
  want = f(c, x, y)
  args = [put(a, mesh8, P("x")) for a in (c, x, y)]
  _close(f(*args), want)
  text = f.lower(*args).compile().as_text()
  (reduce,) = _hlo.collectives(text)
  assert reduce.opcode == "all-reduce"
  assert sum(t.nbytes for t in reduce.result_types) == M * M * 16   # one c128 grid
  (call,) = _hlo.custom_calls(text, "nufft2d1")
  assert local_shapes(call) == [(1, 1, N // 8), (1, N // 8), (1, N // 8)]
  assert _n_j(call) == N // 8


def test_type1_default_opts_within_finufft_eps(partitioner, mesh8, reduced_finufft):
  """Without a pinned upsampfac each device's call picks its own: the result
  stays within FINUFFT's tolerance (eps=1e-6, relative l2) of the whole."""
  c, x, y, _ = _data(1)
  f = jax.jit(lambda c, x, y: reduced_finufft.nufft1((M, M), c, x, y))
  want = np.asarray(f(c, x, y))
  got = np.asarray(f(*[put(a, mesh8, P("x")) for a in (c, x, y)]))
  assert np.linalg.norm(got - want) <= 1e-5 * np.linalg.norm(want)


def test_type1_batch_and_points_on_two_axes(partitioner, mesh2x4, reduced_finufft):
  """Transforms (n_tot) on "a", points on "b": the all-reduce runs over "b"
  only, in groups of 4, and each device transforms 2 x N/4 points."""
  c, x, y, _ = _data(2, batch=(4,))
  f = jax.jit(lambda c, x, y: reduced_finufft.nufft1((M, M), c, x, y, opts=OPTS))
  want = f(c, x, y)
  args = [put(a, mesh2x4, P("a", "b")) for a in (c, x, y)]
  _close(f(*args), want)
  text = f.lower(*args).compile().as_text()
  (reduce,) = _hlo.collectives(text)
  assert reduce.opcode == "all-reduce"
  groups = re.search(r"replica_groups=(\S+)", reduce.text).group(1)
  if groups.startswith("{{"):
    assert [len(g.split(",")) for g in groups[2:-2].split("},{")] == [4, 4]
  else:   # iota form: [2,4]<=[8]
    assert groups.startswith("[2,4]"), groups
  (call,) = _hlo.custom_calls(text, "nufft2d1")
  assert local_shapes(call) == [(2, 1, N // 4), (2, N // 4), (2, N // 4)]
  assert _n_j(call) == N // 4


def test_grad_through_type2_points_sharded(partitioner, mesh8, reduced_finufft):
  _, x, y, grid = _data(3)

  def loss(f, x, y):
    return jnp.sum(jnp.abs(reduced_finufft.nufft2(f, x, y, opts=OPTS)) ** 2)

  g = jax.jit(jax.value_and_grad(loss))
  want = g(grid, x, y)
  args = (grid, put(x, mesh8, P("x")), put(y, mesh8, P("x")))
  got = g(*args)
  np.testing.assert_allclose(got[0], want[0], rtol=1e-9)
  _close(got[1], want[1])
  text = g.lower(*args).compile().as_text()
  colls = _hlo.collectives(text)
  # The gradient's type 1 all-reduces one grid; the loss's sum over the
  # sharded points adds the f64 scalar's own (XLA may combine the two).
  assert {c.opcode for c in colls} == {"all-reduce"}
  assert sum(t.nbytes for c in colls for t in c.result_types) == M * M * 16 + 8
  (forward,) = _hlo.custom_calls(text, "nufft2d2")
  assert local_shapes(forward) == [(1, 1, M, M), (1, N // 8), (1, N // 8)]
  assert _n_j(forward) == N // 8
  (backward,) = _hlo.custom_calls(text, "nufft2d1")
  assert local_shapes(backward) == [(1, 1, N // 8), (1, N // 8), (1, N // 8)]
  assert _n_j(backward) == N // 8


def test_grad_only_has_one_all_reduce(partitioner, mesh8, reduced_finufft):
  """``jax.grad`` alone (no loss value): the type 1's all-reduce is the only
  collective, of one grid."""
  _, x, y, grid = _data(4)
  g = jax.jit(jax.grad(
      lambda f, x, y: jnp.sum(jnp.abs(reduced_finufft.nufft2(f, x, y, opts=OPTS)) ** 2)))
  want = g(grid, x, y)
  args = (grid, put(x, mesh8, P("x")), put(y, mesh8, P("x")))
  _close(g(*args), want)
  (reduce,) = _hlo.collectives(g.lower(*args).compile().as_text())
  assert reduce.opcode == "all-reduce"
  assert sum(t.nbytes for t in reduce.result_types) == M * M * 16
