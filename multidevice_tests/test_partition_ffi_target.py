"""bp.partition_ffi_target: a package that calls jax.ffi.ffi_call directly
(inside jax.custom_batching.custom_vmap, as real packages do) made
partitionable with one line; other targets untouched; undo and redo in one
process; errors naming the entry point. Under Shardy and GSPMD."""

import re

import jax
import numpy as np
import pytest
from jax.sharding import AxisType, PartitionSpec as P

import batchpart as bp
from batchpart import testing as kernels

from helpers import collective_kinds, local_shapes, put, the_custom_call

SOFTMAX = "batchpart_test_softmax"
f32 = np.float32


def _sds(shape):
  return jax.ShapeDtypeStruct(shape, f32)


# ---- a package, as a user finds it: no primitive of its own ------------------

@jax.custom_batching.custom_vmap
def package_softmax(x):
  """One problem per call: x of shape (n,)."""
  return jax.ffi.ffi_call(SOFTMAX, (_sds(x.shape), _sds(())))(x)


@package_softmax.def_vmap
def _package_softmax_vmap(axis_size, in_batched, x):
  del axis_size, in_batched
  # The whole batch in one call: x of shape (batch, n).
  y, lse = jax.ffi.ffi_call(SOFTMAX, (_sds(x.shape), _sds(x.shape[:-1])))(x)
  return (y, lse), (True, True)


def package_axpy(x, y):
  return jax.ffi.ffi_call("batchpart_test_axpy", _sds(x.shape))(x, y, alpha=np.float64(2.0))


def _program(hlo_text: str) -> str:
  """A compiled module's computations, without the source locations of the
  lines that lowered it."""
  return re.sub(r"(, )?metadata=\{[^}]*\}", "", hlo_text.split("\nFileNames")[0])


@pytest.fixture
def declared():
  bp.partition_ffi_target(SOFTMAX, signature="(n)->(n),()")
  yield
  bp.unpartition(SOFTMAX)


def _x(seed=0):
  return np.random.default_rng(seed).standard_normal((64, 16)).astype(f32)


@pytest.mark.timeout(120)
def test_a_package_call_inside_custom_vmap_is_partitioned(partitioner, mesh8, declared):
  f = jax.jit(jax.vmap(package_softmax))
  for spec in (P("x"), P(None, "x")):
    xs = put(_x(), mesh8, spec)
    text = f.lower(xs).compile().as_text()
    assert local_shapes(the_custom_call(text, SOFTMAX)) == [(8, 16)]
    if spec == P("x"):
      assert collective_kinds(text) == set()
    kernels.reset_batch_elements_processed()
    y, lse = f(xs)
    jax.block_until_ready((y, lse))
    assert kernels.batch_elements_processed() == 64
    want_y, want_lse = kernels.softmax_reference(_x())
    np.testing.assert_allclose(y, want_y, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-5, atol=1e-6)


@pytest.mark.timeout(120)
def test_other_targets_compile_as_without_batchpart(partitioner, mesh8):
  x, y = put(_x(1), mesh8, P("x")), put(_x(2), mesh8, P("x"))
  before = jax.jit(package_axpy).lower(x, y).compile().as_text()
  bp.partition_ffi_target(SOFTMAX, signature="(n)->(n),()")
  try:
    after = jax.jit(package_axpy).lower(x, y).compile().as_text()
  finally:
    bp.unpartition(SOFTMAX)
  assert _program(after) == _program(before)
  np.testing.assert_allclose(jax.jit(package_axpy)(x, y), 2 * _x(1) + _x(2), rtol=1e-6)


@pytest.mark.timeout(120)
def test_undo_and_redo_in_one_process(partitioner, mesh8):
  traces = []

  def f(x):
    traces.append(1)
    return jax.vmap(package_softmax)(x)

  jitted = jax.jit(f)
  xs = put(_x(3), mesh8, P("x"))
  stock = jitted.lower(xs).compile().as_text()
  assert "all-gather" in collective_kinds(stock)   # XLA's default: gather, replicate
  jitted(xs)
  for _ in range(2):   # declare, undo, declare again
    bp.partition_ffi_target(SOFTMAX, signature="(n)->(n),()")
    text = jitted.lower(xs).compile().as_text()
    assert local_shapes(the_custom_call(text, SOFTMAX)) == [(8, 16)]
    np.testing.assert_allclose(jitted(xs)[0], kernels.softmax_reference(_x(3))[0],
                               rtol=1e-5, atol=1e-6)
    bp.unpartition(SOFTMAX)
    assert _program(jitted.lower(xs).compile().as_text()) == _program(stock)
  n = len(traces)
  jitted(xs)   # back to no declaration: the stock executable, no new trace
  assert len(traces) == n


@pytest.mark.timeout(120)
def test_a_jit_compiled_before_the_declaration_follows_it(mesh8):
  f = jax.jit(jax.vmap(package_softmax))
  xs = put(_x(4), mesh8, P("x"))
  compiled = f.lower(xs).compile()   # compiled objects never change
  f(xs)
  bp.partition_ffi_target(SOFTMAX, signature="(n)->(n),()")
  try:
    text = f.lower(xs).compile().as_text()
    assert local_shapes(the_custom_call(text, SOFTMAX)) == [(8, 16)]
    assert "all-gather" in collective_kinds(compiled.as_text())
    np.testing.assert_allclose(f(xs)[0], compiled(xs)[0], rtol=1e-5, atol=1e-6)
  finally:
    bp.unpartition(SOFTMAX)


@pytest.mark.timeout(120)
def test_explicit_mode_results_are_batch_sharded(declared):
  mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Explicit,))
  with jax.set_mesh(mesh):
    bp.unpartition(SOFTMAX)
    bp.partition_ffi_target(SOFTMAX, num_batch_dims=1)
    xs = jax.device_put(_x(5), P("x"))
    y, lse = jax.jit(jax.vmap(package_softmax))(xs)
    assert jax.typeof(y).sharding.spec == P("x", None)
    assert jax.typeof(lse).sharding.spec == P("x")
    np.testing.assert_allclose(y, kernels.softmax_reference(_x(5))[0], rtol=1e-5,
                               atol=1e-6)


@pytest.mark.timeout(60)
def test_a_call_that_does_not_fit_names_the_entry_point_and_target(mesh8, declared):
  bp.unpartition(SOFTMAX)
  bp.partition_ffi_target(SOFTMAX, num_batch_dims=1)
  with pytest.raises(ValueError, match=r"partition_ffi_target\('batchpart_test_softmax'\)"
                     r".*num_batch_dims=1 exceeds the rank of result 1"):
    jax.jit(package_softmax).lower(np.ones(16, f32))   # one problem: no batch dim


@pytest.mark.timeout(60)
def test_declaration_errors():
  with pytest.raises(TypeError, match="target_name must be a non-empty str"):
    bp.partition_ffi_target(3, num_batch_dims=1)
  with pytest.raises(ValueError, match="exactly one of num_batch_dims and signature"):
    bp.partition_ffi_target(SOFTMAX)
  with pytest.raises(ValueError, match="unpartition.*'never_declared'.*not partitioned"):
    bp.unpartition("never_declared")
  bp.partition_ffi_target(SOFTMAX, num_batch_dims=1)
  try:
    bp.partition_ffi_target(SOFTMAX, num_batch_dims=np.int64(1))   # the same: no-op
    with pytest.raises(ValueError, match="already partitioned.*unpartition"):
      bp.partition_ffi_target(SOFTMAX, signature="(n)->(n),()")
  finally:
    bp.unpartition(SOFTMAX)
