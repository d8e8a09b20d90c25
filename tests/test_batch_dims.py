"""The flow of a wrapper's batch dims through a jaxpr (``_frontend/batch_dims``)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from batchpart import _compat as compat
from batchpart._frontend import batch_dims


def _jaxpr(f, shapes):
  return jax.make_jaxpr(f)(*(np.zeros(s, np.float32) for s in shapes)).jaxpr


def _flow(f, shapes, in_dims):
  """The dims of ``f``'s output (its jaxpr flat) on float32 arrays of ``shapes``
  whose dims are ``in_dims``."""
  jaxpr = _jaxpr(f, shapes)
  known = dict(zip(jaxpr.invars, in_dims))

  def dims(v):
    return batch_dims.shared(0) if isinstance(v, compat.Literal) else known[v]

  for eqn in jaxpr.eqns:
    known.update(zip(eqn.outvars, batch_dims.forward(eqn, [dims(v) for v in eqn.invars])))
  return dims(jaxpr.outvars[0])


@pytest.mark.parametrize("shape, new_shape, sources, altered", [
    ((8, 4), (8, 2, 2), (0, None, None), {1}),          # a core dim split
    ((2, 3, 6), (6, 6), (None, 2), {0, 1}),             # two dims merged
    ((8, 1, 4), (8, 4), (0, 2), {1}),                   # a size-1 dim dropped
    ((8, 4), (1, 8, 4), (None, 0, 1), set()),           # a size-1 dim added
    ((4, 8), (8, 4), (None, None), {0, 1}),             # same sizes, other dims
])
def test_reshape_keeps_the_dims_that_survive_intact(shape, new_shape, sources, altered):
  assert batch_dims._reshape_map(shape, new_shape) == (sources, frozenset(altered))


@pytest.mark.parametrize("dims, batch_rank, place", [
    ((None, 0), 1, (1, 1)),
    ((0, None), 1, (0, 1)),
    ((None, None), 1, (0, 0)),
    ((None, 1), 2, (1, 1)),       # the last batch dim only: it broadcasts
    ((0, 1, None), 2, (0, 2)),
    ((1, 0), 2, None),            # out of order
    ((0, None, 1), 2, None),      # not one run
    ((0,), 2, None),              # not the last batch dims
    ((0, 0), 1, None),            # one batch dim twice
])
def test_block_is_one_run_of_the_last_batch_dims_in_order(dims, batch_rank, place):
  assert batch_dims.block(dims, batch_rank) == place


@pytest.mark.parametrize("f, shapes, in_dims, out_dims", [
    (lambda x: x.T, [(8, 8)], [(0, None)], (None, 0)),
    (lambda x: jnp.moveaxis(x, 0, -1), [(8, 3, 8)], [(0, None, None)], (None, None, 0)),
    (lambda x: x.reshape(8, 2, 4), [(8, 8)], [(0, None)], (0, None, None)),
    (lambda x: x[:, :3], [(8, 8)], [(0, None)], (0, None)),
    (lambda x: x.sum(0), [(8, 8)], [(0, None)], (None,)),
    (lambda x, w: x + w, [(8, 8), (8, 8)], [(0, None), (None, None)], (0, None)),
    (lambda x: x * 2.0, [(8, 8)], [(0, None)], (0, None)),
    (lambda x: x.astype(jnp.float16), [(8, 8)], [(None, 0)], (None, 0)),
    (lambda x: jnp.broadcast_to(x, (3, 8, 8)), [(8, 8)], [(0, None)],
     (batch_dims.BUILT, 0, None)),
    (lambda x, w: x @ w, [(8, 8), (8, 8)], [(0, None), (None, None)], (0, None)),
    (lambda x, w: w @ x, [(8, 8), (8, 8)], [(None, 0), (None, None)], (None, 0)),
])
def test_known_primitives_carry_the_batch_dims(f, shapes, in_dims, out_dims):
  assert _flow(f, shapes, in_dims) == out_dims


@pytest.mark.parametrize("f, shapes, in_dims", [
    (lambda x: x.reshape(64), [(8, 8)], [(0, None)]),            # merged with a core dim
    (lambda x: x[:4], [(8, 8)], [(0, None)]),                    # cut
    (lambda x: jax.lax.rev(x, (0,)), [(8, 8)], [(0, None)]),     # reordered
    (lambda x: jax.lax.sort(x, dimension=1), [(8, 8)], [(0, None)]),  # unknown to the flow
    (lambda x: x + x.T, [(8, 8)], [(0, None)]),                  # rows and columns mixed
])
def test_the_flow_cannot_tell(f, shapes, in_dims):
  dims = _flow(f, shapes, in_dims)
  assert dims is None or batch_dims.block(dims, 1) is None


def test_values_that_carry_no_batch_dim_give_results_that_carry_none():
  sort = lambda w: jax.lax.sort(w, dimension=0)  # noqa: E731
  assert _flow(sort, [(8, 8)], [(None, None)]) == (None, None)
  assert _flow(sort, [(8, 8)], [(0, None)]) is None


def test_demands_walk_back_from_the_outputs():
  jaxpr = _jaxpr(lambda r: jax.jit(lambda r: (r * 2.0).T)(r), [(8, 8)])
  want = batch_dims.demands(jaxpr, [(None, 0)])
  assert want[jaxpr.invars[0]] == (0, None)


def test_uses_that_disagree_clash():
  jaxpr = _jaxpr(lambda r: (r, r.T), [(8, 8)])
  want = batch_dims.demands(jaxpr, [(0, None), (0, None)])
  assert want[jaxpr.invars[0]] == (0, 0)   # both dims said to be batch dim 0
  want = batch_dims.demands(jaxpr, [(0, 1), (0, 1)])
  assert want[jaxpr.invars[0]] == (batch_dims.CLASH, batch_dims.CLASH)


B = batch_dims.BUILT


@pytest.mark.parametrize("f, shapes, in_dims, out_dims", [
    # Dims the wrapper makes: they may hold one entry per batch element.
    (lambda x: jnp.arange(8.0) + 0 * x.sum(), [(8, 8)], [(0, None)], (B,)),
    (lambda w: jnp.broadcast_to(w, (8, 5)), [(5,)], [(None,)], (B, None)),
    (lambda x: jnp.broadcast_to(jnp.arange(5.0), x.shape), [(8, 5)], [(0, None)], (B, B)),
    (lambda x: jnp.arange(40.0).reshape(8, 5) + 0 * x.sum(), [(8, 5)], [(0, None)], (B, B)),
    # An argument's core dims stay core: sliced, combined with built values.
    (lambda w: w[:, :3], [(8, 5)], [(None, None)], (None, None)),
    (lambda w: w + jnp.arange(5.0), [(8, 5)], [(None, None)], (None, None)),
    (lambda x: x + jnp.arange(5.0), [(8, 5)], [(0, None)], (0, None)),
    (lambda x: x + jnp.ones((8, 5)), [(8, 5)], [(0, None)], (0, None)),
    (lambda w: jax.lax.sort(w, dimension=0), [(8, 5)], [(None, None)], (None, None)),
    (lambda w: jax.lax.sort(w + jnp.ones((8, 5)), dimension=0), [(8, 5)], [(B, B)], (B, B)),
])
def test_dims_the_wrapper_builds_are_told_from_core_dims(f, shapes, in_dims, out_dims):
  assert _flow(f, shapes, in_dims) == out_dims
