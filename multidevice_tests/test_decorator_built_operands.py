"""Operands a decorated wrapper builds inside itself (an iota, a broadcast of
a shared argument, constants, closures), on 8 simulated devices: a dim the
wrapper made with the size of batch dims the operand does not carry, or of a
reduced dim, may be read by the kernel either way, so the call keeps it whole
(the whole call, or the reduced dim) with a warning naming the wrapper and the
operand. Values always equal the unsharded call's; operands whose dims the
flow follows stay partitioned."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import assume, given, settings, strategies as st
from jax.sharding import AxisType

import batchpart as bp

from helpers import compiled_text, local_shapes, put, random_spec, the_custom_call

TARGET = "batchpart_test_reduce_rows"
P = jax.sharding.PartitionSpec
_CLOSED = np.arange(8 * 16, dtype=np.float32).reshape(8, 16) % 7


def _kernel(x, w):
  """out[..., k] = sum over n of w[..., n] x[..., n, k], batch dims broadcast."""
  out = jax.ShapeDtypeStruct((*x.shape[:-2], x.shape[-1]), x.dtype)
  return jax.ffi.ffi_call(TARGET, out)(x, w, op=np.int64(0), rows=np.int64(-1))


# name -> (builds w from x (and the shared argument s), whether it needs s,
#          whether a sharded call stays partitioned over the batch)
_BUILDERS = {
    "iota": (lambda x, s: jnp.broadcast_to(jnp.arange(x.shape[-2], dtype=x.dtype),
                                           x.shape[:-1]), False),
    "per_row": (lambda x, s: jnp.arange(x.shape[0] * x.shape[1], dtype=x.dtype)
                .reshape(x.shape[:-1]) % 5, False),
    "ones": (lambda x, s: jnp.ones(x.shape[:-1], x.dtype), False),
    "shared_broadcast": (lambda x, s: jnp.broadcast_to(s, x.shape[:-1]), True),
    "shared_direct": (lambda x, s: 2.0 * s, True),
    "closure": (lambda x, s: jnp.asarray(_CLOSED[:x.shape[0], :x.shape[1]]), False),
    "vector_iota": (lambda x, s: jnp.arange(x.shape[-2], dtype=x.dtype), False),
    "from_x": (lambda x, s: x.sum(-1) % 3, False),
}


def _wrapper(build: str, reduce: bool):
  fn, needs_s = _BUILDERS[build]
  reduced = {"reduce": {"n": "sum"}} if reduce else {}
  if needs_s:
    def wrapper(x, s):
      return _kernel(x, fn(x, s))
    return bp.batch_partitionable(wrapper, signature="(n,k),(n)->(k)", **reduced)

  def wrapper_x(x):
    return _kernel(x, fn(x, None))
  return bp.batch_partitionable(wrapper_x, signature="(n,k)->(k)", **reduced)


def _reference(build, x, s):
  w = np.asarray(_BUILDERS[build][0](jnp.asarray(x), None if s is None else jnp.asarray(s)))
  return np.einsum("...nk,...n->...k", x, np.broadcast_to(w, x.shape[:-1]))


def _run(build, reduce, x, s, mesh, spec):
  f = _wrapper(build, reduce)
  args = [put(x, mesh, spec)]
  if _BUILDERS[build][1]:
    args.append(put(s, mesh, P(spec[1] if len(spec) > 1 else None)))
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    out = jax.jit(f)(*args)
  return np.asarray(out), [str(w.message) for w in caught]


@pytest.mark.timeout(600)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_built_operands_give_the_unsharded_values(data):
  build = data.draw(st.sampled_from(sorted(_BUILDERS)), label="builder")
  reduce = data.draw(st.booleans(), label="reduce n")
  batch = data.draw(st.sampled_from([2, 4, 8]), label="batch")
  n = data.draw(st.sampled_from([4, 8, 16]), label="n")
  shape = data.draw(st.sampled_from([(8,), (2, 4), (4, 2)]), label="mesh")
  explicit = data.draw(st.booleans(), label="explicit")
  shardy = data.draw(st.booleans(), label="shardy")
  kind = AxisType.Explicit if explicit else AxisType.Auto
  mesh = jax.make_mesh(shape, ("a", "b")[:len(shape)], axis_types=(kind,) * len(shape))
  spec = random_spec(data, mesh, 3, "x")
  assume(all(size % _tiles(mesh, e) == 0 for size, e in zip((batch, n, 3), spec)))
  rng = np.random.default_rng(batch * n)
  x = rng.integers(-3, 4, (batch, n, 3)).astype(np.float32)
  s = rng.integers(-3, 4, (n,)).astype(np.float32)
  previous = jax.config.jax_use_shardy_partitioner
  jax.config.update("jax_use_shardy_partitioner", shardy)
  try:
    with jax.set_mesh(mesh) if explicit and data.draw(st.booleans(), label="context") \
        else _no_context():
      out, _ = _run(build, reduce, x, s, mesh, spec)
  finally:
    jax.config.update("jax_use_shardy_partitioner", previous)
  np.testing.assert_array_equal(out, _reference(build, x, s))


def _tiles(mesh, entry) -> int:
  axes = () if entry is None else (entry,) if isinstance(entry, str) else entry
  return int(np.prod([mesh.shape[a] for a in axes]))


class _no_context:
  def __enter__(self):
    return self

  def __exit__(self, *exc):
    return False


@pytest.mark.timeout(120)
@pytest.mark.parametrize("build", ["iota", "per_row", "shared_broadcast", "closure"])
def test_a_built_batch_dim_keeps_the_call_whole_and_warns(build, mesh2x4):
  x = np.random.default_rng(0).integers(-3, 4, (4, 8, 3)).astype(np.float32)
  s = np.arange(8, dtype=np.float32)
  out, caught = _run(build, build in ("iota", "closure"), x, s, mesh2x4, P("a", "b", None))
  np.testing.assert_array_equal(out, _reference(build, x, s))
  assert any(f"{'wrapper' if _BUILDERS[build][1] else 'wrapper_x'})" in m
             and "operand 1 (shape (4, 8)) is built inside the wrapper" in m
             and "stays unpartitioned" in m for m in caught), caught


@pytest.mark.timeout(120)
def test_a_built_dim_of_the_reduced_size_keeps_the_reduced_dim_whole(mesh2x4):
  x = np.random.default_rng(1).integers(-3, 4, (4, 8, 3)).astype(np.float32)
  f = _wrapper("vector_iota", reduce=True)
  xs = put(x, mesh2x4, P("a", "b", None))
  with pytest.warns(UserWarning, match=r"wrapper_x.*keeps the reduced dim whole.*operand 1 "
                                       r"is built inside the wrapper"):
    text = compiled_text(f, xs)
    out = jax.jit(f)(xs)
  # n whole, its axis moved onto the batch: the built (n,) vector is read along x's n.
  assert local_shapes(the_custom_call(text, TARGET)) == [(1, 8, 3), (8,)]
  np.testing.assert_array_equal(out, _reference("vector_iota", x, None))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("build", ["shared_direct", "from_x"])
def test_operands_the_flow_follows_stay_partitioned(build, mesh2x4):
  x = np.random.default_rng(2).integers(-3, 4, (4, 8, 3)).astype(np.float32)
  s = np.arange(8, dtype=np.float32)
  f = _wrapper(build, reduce=True)
  args = [put(x, mesh2x4, P("a", "b", None))]
  if _BUILDERS[build][1]:
    args.append(put(s, mesh2x4, P("b")))
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    text = compiled_text(f, *args)
    out = jax.jit(f)(*args)
  shapes = local_shapes(the_custom_call(text, TARGET))
  assert shapes[0] == (2, 2, 3), shapes
  np.testing.assert_array_equal(out, _reference(build, x, s))
