"""How batchpart calls partition, under Shardy and GSPMD: batch- and
core-sharded inputs, broadcast operands, uneven batches, 2-D meshes, Explicit
and Manual modes, vmap, and the decorator on a plain ``jax.ffi.ffi_call``.

Each asserts on the compiled HLO (collectives, per-device custom-call operand
shapes) and on values against NumPy.
"""

import jax
import numpy as np
import pytest
from jax.sharding import AxisType, PartitionSpec as P

import batchpart as bp
from batchpart import _core, testing as kernels

from helpers import collective_kinds, compiled_text, local_shapes, put, rng, the_custom_call

SOFTMAX = "batchpart_test_softmax"
MATVEC = "batchpart_test_matvec"


def _assert_softmax(y, lse, x):
  ref_y, ref_lse = kernels.softmax_reference(x)
  np.testing.assert_allclose(y, ref_y, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(lse, ref_lse, rtol=1e-5, atol=1e-6)


# Batch-sharded input: no collectives, local shard, batch-sharded results.
def test_batch_sharded_has_no_collectives(partitioner, mesh8):
  x = rng().standard_normal((64, 16), dtype=np.float32)
  xs = put(x, mesh8, P("x"))
  text = compiled_text(kernels.softmax, xs)
  assert collective_kinds(text) == set()
  assert local_shapes(the_custom_call(text, SOFTMAX)) == [(8, 16)]
  kernels.reset_batch_elements_processed()
  y, lse = jax.jit(kernels.softmax)(xs)
  _assert_softmax(y, lse, x)
  assert kernels.batch_elements_processed() == 64  # no device redid any row
  assert y.sharding.spec[0] == "x" and lse.sharding.spec[0] == "x"


# Core-sharded input: the work is split 8 ways (all-to-all, not replication).
def test_core_sharded_splits_work_eight_ways(partitioner, mesh8):
  x = rng(1).standard_normal((64, 16), dtype=np.float32)
  xs = put(x, mesh8, P(None, "x"))
  text = compiled_text(kernels.softmax, xs)
  assert local_shapes(the_custom_call(text, SOFTMAX)) == [(8, 16)]  # 1/8 of it
  assert "all-to-all" in collective_kinds(text)
  kernels.reset_batch_elements_processed()
  _assert_softmax(*jax.jit(kernels.softmax)(xs), x)
  assert kernels.batch_elements_processed() == 64


# A broadcast operand is neither gathered nor materialised.
def test_broadcast_operand_is_not_materialised(partitioner, mesh8):
  a = rng(2).standard_normal((16, 4, 6), dtype=np.float32)
  v = rng(3).standard_normal((6,), dtype=np.float32)
  f = lambda a, v: kernels.matvec(a, v, alpha=2.0)
  args = put(a, mesh8, P("x")), put(v, mesh8, P())
  text = compiled_text(f, *args)
  assert collective_kinds(text) == set()
  assert local_shapes(the_custom_call(text, MATVEC)) == [(2, 4, 6), (6,)]
  np.testing.assert_allclose(jax.jit(f)(*args), 2 * a @ v, rtol=1e-5, atol=1e-5)


def test_size_one_batch_dim_is_broadcast(partitioner, mesh8):
  a = rng(4).standard_normal((8, 1, 3, 5), dtype=np.float32)
  v = rng(5).standard_normal((4, 5), dtype=np.float32)
  args = put(a, mesh8, P("x")), put(v, mesh8, P())
  text = compiled_text(kernels.matvec, *args)
  assert local_shapes(the_custom_call(text, MATVEC)) == [(1, 1, 3, 5), (4, 5)]
  assert collective_kinds(text) == set()
  np.testing.assert_allclose(jax.jit(kernels.matvec)(*args),
                             np.einsum("abij,bj->abi", a, v), rtol=1e-5, atol=1e-5)


# Uneven batch inside jit: right values.
@pytest.mark.parametrize("n", [10, 3, 1])
def test_uneven_batch(partitioner, mesh8, n):
  x = rng(6).standard_normal((16, 8), dtype=np.float32)
  xs = put(x, mesh8, P("x"))
  y, lse = jax.jit(lambda x: kernels.softmax(x[:n]))(xs)
  _assert_softmax(y, lse, x[:n])


# 2-D mesh: over both axes 1/8; over one axis 1/4 and replicated.
@pytest.mark.parametrize("spec,local", [
    (P(("a", "b")), (2, 8)), (P("a"), (8, 8)), (P("b"), (4, 8))])
def test_two_dim_mesh(partitioner, mesh2x4, spec, local):
  x = rng(7).standard_normal((16, 8), dtype=np.float32)
  xs = put(x, mesh2x4, spec)
  text = compiled_text(kernels.softmax, xs)
  assert collective_kinds(text) == set()
  assert local_shapes(the_custom_call(text, SOFTMAX)) == [local]
  _assert_softmax(*jax.jit(kernels.softmax)(xs), x)


def test_two_batch_dims_over_two_axes(partitioner, mesh2x4):
  x = rng(8).standard_normal((4, 8, 8), dtype=np.float32)
  xs = put(x, mesh2x4, P("a", "b"))
  text = compiled_text(kernels.softmax, xs)
  assert collective_kinds(text) == set()
  assert local_shapes(the_custom_call(text, SOFTMAX)) == [(2, 2, 8)]
  _assert_softmax(*jax.jit(kernels.softmax)(xs), x)


def test_two_dim_mesh_core_axis_moves_to_batch(partitioner, mesh2x4):
  x = rng(9).standard_normal((16, 8), dtype=np.float32)
  xs = put(x, mesh2x4, P("a", "b"))
  text = compiled_text(kernels.softmax, xs)
  assert local_shapes(the_custom_call(text, SOFTMAX)) == [(2, 8)]
  assert "all-to-all" in collective_kinds(text)
  _assert_softmax(*jax.jit(kernels.softmax)(xs), x)


# Explicit mode: result types carry the batch sharding; no all-gather.
def test_explicit_mode(partitioner):
  mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Explicit,))
  x = rng(10).standard_normal((16, 8), dtype=np.float32)
  with jax.set_mesh(mesh):
    xs = put(x, mesh, P("x"))
    y, lse = jax.jit(kernels.softmax)(xs)
    assert jax.typeof(y).sharding.spec == P("x", None)
    assert jax.typeof(lse).sharding.spec == P("x")
    text = compiled_text(kernels.softmax, xs)
  assert collective_kinds(text) == set()
  assert local_shapes(the_custom_call(text, SOFTMAX)) == [(2, 8)]
  _assert_softmax(y, lse, x)


def test_explicit_mode_broadcast_operand(partitioner):
  mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Explicit,))
  a = rng(11).standard_normal((16, 4, 6), dtype=np.float32)
  v = rng(12).standard_normal((6,), dtype=np.float32)
  with jax.set_mesh(mesh):
    args = put(a, mesh, P("x")), put(v, mesh, P())
    y = jax.jit(kernels.matvec)(*args)
    assert jax.typeof(y).sharding.spec == P("x", None)
    assert collective_kinds(compiled_text(kernels.matvec, *args)) == set()
  np.testing.assert_allclose(y, a @ v, rtol=1e-5, atol=1e-5)


# Manual mode: inside shard_map.
def test_inside_shard_map(partitioner, mesh8):
  x = rng(13).standard_normal((16, 8), dtype=np.float32)
  f = jax.shard_map(kernels.softmax, mesh=mesh8, in_specs=P("x"),
                    out_specs=(P("x"), P("x")))
  xs = put(x, mesh8, P("x"))
  text = compiled_text(f, xs)
  assert collective_kinds(text) == set()
  assert local_shapes(the_custom_call(text, SOFTMAX)) == [(2, 8)]
  _assert_softmax(*jax.jit(f)(xs), x)


def test_inside_shard_map_partially_manual(partitioner, mesh2x4):
  x = rng(14).standard_normal((16, 8), dtype=np.float32)
  f = jax.shard_map(kernels.softmax, mesh=mesh2x4, in_specs=P("a"),
                    out_specs=(P("a"), P("a")), axis_names={"a"})
  xs = put(x, mesh2x4, P(("a", "b")))
  _assert_softmax(*jax.jit(f)(xs), x)


# vmap: one custom call with one more batch dim, no loop.
@pytest.mark.parametrize("in_axes", [0, 1, 2])
def test_vmap_is_one_call(partitioner, mesh8, in_axes):
  x = rng(15).standard_normal((8, 16, 8), dtype=np.float32)
  xs = put(x, mesh8, P(*([None] * in_axes), "x"))
  f = jax.vmap(kernels.softmax, in_axes=in_axes)
  text = compiled_text(f, xs)
  assert "while" not in text
  the_custom_call(text, SOFTMAX)
  y, lse = jax.jit(f)(xs)
  _assert_softmax(y, lse, np.moveaxis(x, in_axes, 0))


def test_vmap_unbatched_operand_broadcasts(partitioner, mesh8):
  a = rng(16).standard_normal((4, 3, 6), dtype=np.float32)
  vs = rng(17).standard_normal((16, 6), dtype=np.float32)
  f = jax.vmap(kernels.matvec, in_axes=(None, 0))
  args = put(a, mesh8, P()), put(vs, mesh8, P("x"))
  text = compiled_text(f, *args)
  assert "while" not in text and collective_kinds(text) == set()
  assert local_shapes(the_custom_call(text, MATVEC)) == [(4, 3, 6), (2, 1, 6)]
  np.testing.assert_allclose(jax.jit(f)(*args), np.einsum("bij,cj->cbi", a, vs),
                             rtol=1e-5, atol=1e-5)


# The decorator on a wrapper of a plain jax.ffi.ffi_call.
jax.ffi.register_ffi_target("plain_test_softmax", _core.testing.handlers()["softmax"],
                            platform="cpu")
# The same kernel under a name batchpart never marks, for contrast.
jax.ffi.register_ffi_target("unmarked_test_softmax", _core.testing.handlers()["softmax"],
                            platform="cpu")


@bp.batch_partitionable(signature="(n)->(n),()")
def wrapped_softmax(x):
  return jax.ffi.ffi_call(
      "plain_test_softmax",
      (jax.ShapeDtypeStruct(x.shape, x.dtype),
       jax.ShapeDtypeStruct(x.shape[:-1], x.dtype)))(x)


def test_decorator_on_plain_ffi_call(partitioner, mesh8):
  x = rng(18).standard_normal((64, 16), dtype=np.float32)
  xs = put(x, mesh8, P("x"))
  text = compiled_text(wrapped_softmax, xs)
  assert collective_kinds(text) == set()
  assert local_shapes(the_custom_call(text, "plain_test_softmax")) == [(8, 16)]
  assert bp.is_batch_partitionable("plain_test_softmax")
  y, lse = jax.jit(wrapped_softmax)(xs)
  _assert_softmax(y, lse, x)
  assert y.sharding.spec[0] == "x"


def test_plain_ffi_call_gathers_for_contrast(partitioner, mesh8):
  """Without batchpart the same kernel runs the whole batch everywhere."""
  x = rng(19).standard_normal((64, 16), dtype=np.float32)
  plain = lambda x: jax.ffi.ffi_call(
      "unmarked_test_softmax",
      (jax.ShapeDtypeStruct(x.shape, x.dtype),
       jax.ShapeDtypeStruct(x.shape[:-1], x.dtype)))(x)[0]
  text = compiled_text(plain, put(x, mesh8, P("x")))
  assert local_shapes(the_custom_call(text, "unmarked_test_softmax")) == [(64, 16)]
  assert "all-gather" in collective_kinds(text)
