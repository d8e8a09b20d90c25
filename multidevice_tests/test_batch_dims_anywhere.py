"""Batch dims anywhere: a signature's ``...`` puts each array's batch dims
after some of its core dims. ``batchpart_test_core_sum`` reads where they are
from its attributes and sums every core element of both operands at each
batch element, so a device that got the wrong block, or core dims split
across devices, gives wrong values."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export
from jax.interpreters import mlir
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import batchpart as bp
from batchpart import _compat as compat, testing as kernels

from helpers import collective_kinds, flat, local_shapes, put, the_custom_call

CORE_SUM = "batchpart_test_core_sum"
AXPY = "batchpart_test_axpy"
S = jax.ShapeDtypeStruct


def core_sum_attrs(x_lead, x_trail, y_lead, y_trail, out_lead, out_trail):
  return {k: np.int64(v) for k, v in dict(
      x_lead=x_lead, x_trail=x_trail, y_lead=y_lead, y_trail=y_trail, out_lead=out_lead,
      out_trail=out_trail).items()}


def core_sum_reference(x, y, x_lead, x_trail, y_lead, y_trail, out_shape, out_lead,
                       out_trail):
  """NumPy: both operands' core elements summed per batch element, then
  broadcast over the result's core dims."""
  def per_batch(a, lead, trail):
    return a.sum(axis=(*range(lead), *range(a.ndim - trail, a.ndim)))
  s = per_batch(x, x_lead, x_trail) + per_batch(y, y_lead, y_trail)
  rank = len(out_shape) - out_lead - out_trail
  s = s.reshape((1,) * (rank - s.ndim) + s.shape)
  return np.broadcast_to(s.reshape((1,) * out_lead + s.shape + (1,) * out_trail), out_shape)


# "(a,f,...,r),(f,...)->(p,f,...)": x (a=2, f=3, batch (16, 4), r=5), y (f=3,
# batch (4,)) broadcast, result (p=2, f=3, batch (16, 4)).
SIG = "(a,f,...,r),(f,...)->(p,f,...)"
X_SHAPE, Y_SHAPE, OUT_SHAPE = (2, 3, 16, 4, 5), (3, 4), (2, 3, 16, 4)
ATTRS = core_sum_attrs(2, 1, 1, 0, 2, 0)


def mid(x, y):
  return bp.ffi_call(CORE_SUM, S(OUT_SHAPE, x.dtype), signature=SIG)(x, y, **ATTRS)


def mid_reference(x, y):
  return core_sum_reference(x, y, 2, 1, 1, 0, OUT_SHAPE, 2, 0)


def operands(seed=0, dtype=np.float32):
  rng = np.random.default_rng(seed)
  return (rng.standard_normal(X_SHAPE).astype(dtype),
          rng.standard_normal(Y_SHAPE).astype(dtype))


def assert_close(actual, expected):
  np.testing.assert_allclose(np.asarray(actual), expected, rtol=1e-4, atol=1e-4)


def assert_batch_split(f, x, y, xs, ys=None):
  """Jitted ``f`` on ``xs`` (``x`` sharded over batch dim 0) and ``ys`` (``y``
  by default) runs the kernel on each device's block with no collective and
  gives ``mid``'s values."""
  ys = y if ys is None else ys
  text = f.lower(xs, ys).compile().as_text()
  assert local_shapes(the_custom_call(text, CORE_SUM))[0] == (2, 3, 2, 4, 5)
  assert collective_kinds(text) == set()
  assert_close(f(xs, ys), mid_reference(x, y))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("spec, local_x, collectives", [
    (P(None, None, "x"), (2, 3, 2, 4, 5), set()),              # batch dim 0 (in the middle)
    (P(), (2, 3, 16, 4, 5), set()),                             # replicated: no batch sharding
    (P("x"), (2, 3, 2, 4, 5), {"all-to-all"}),                  # a leading core dim
    (P(None, None, None, None, "x"), (2, 3, 2, 4, 5), {"all-to-all"}),  # a trailing one
])
def test_batch_dims_in_the_middle(partitioner, spec, local_x, collectives):
  mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))
  x, y = operands()
  if spec == P("x"):
    x = np.concatenate([x] * 4)[:8]   # a leading core dim of 8, shardable 8 ways
  elif spec == P(None, None, None, None, "x"):
    x = np.concatenate([x] * 2, axis=-1)[..., :8]
  xs = put(x, mesh, spec)
  f = jax.jit(mid)
  text = f.lower(xs, y).compile().as_text()
  call = the_custom_call(text, CORE_SUM)
  want_x = (x.shape[0], 3, 2, 4, x.shape[-1]) if local_x != X_SHAPE else x.shape
  assert local_shapes(call)[0] == want_x
  assert local_shapes(call)[1] == Y_SHAPE
  if collectives:
    assert collective_kinds(text) - {"all-gather"} >= collectives
  else:
    assert collective_kinds(text) == set()
  # A core-sharded x is re-batched, never gathered in front of the call.
  (report,) = bp.explain(f, xs, y).calls
  assert "all-gather" not in {c.kind for c in report.collectives_before}
  assert report.replication == (8 if spec == P() else 1)
  assert_close(f(xs, y), mid_reference(x, y))


@pytest.mark.timeout(120)
def test_leading_core_dim_sharded_is_rebatched_not_gathered(partitioner, mesh8):
  """A mesh axis on a core dim before '...' moves onto a batch dim (an
  all-to-all) and each device computes its own batch block."""
  x, y = operands()
  x = np.concatenate([x] * 4)      # a = 8
  sig_x_shape = x.shape
  f = jax.jit(lambda x, y: bp.ffi_call(CORE_SUM, S(OUT_SHAPE, x.dtype), signature=SIG)(
      x, y, **ATTRS))
  xs = put(x, mesh8, P("x"))
  text = f.lower(xs, y).compile().as_text()
  assert local_shapes(the_custom_call(text, CORE_SUM))[0] == (8, 3, 2, 4, 5)
  assert "all-to-all" in collective_kinds(text)
  kernels.reset_batch_elements_processed()
  out = np.asarray(f(xs, y))
  assert kernels.batch_elements_processed() == 16 * 4   # each element once
  assert_close(out, core_sum_reference(x, y, 2, 1, 1, 0, OUT_SHAPE, 2, 0))
  assert sig_x_shape == (8, 3, 16, 4, 5)


@pytest.mark.timeout(120)
def test_two_dim_mesh(partitioner, mesh2x4):
  x, y = operands(1)
  for spec, local in ((P(None, None, "a", "b"), (2, 3, 8, 1, 5)),
                      (P(None, None, ("a", "b")), (2, 3, 2, 4, 5)),
                      (P("a", None, "b"), (2, 3, 2, 4, 5))):
    xs = put(x, mesh2x4, spec)
    text = jax.jit(mid).lower(xs, y).compile().as_text()
    assert local_shapes(the_custom_call(text, CORE_SUM))[0] == local, spec
    assert_close(jax.jit(mid)(xs, y), mid_reference(x, y))


@pytest.mark.timeout(120)
def test_elementwise_kernel_batch_dims_after_core(partitioner, mesh8):
  """axpy is elementwise, so any placement of the batch dims computes the
  same values: here they follow two core dims."""
  rng = np.random.default_rng(2)
  x, y = (rng.standard_normal((3, 2, 16, 5)).astype(np.float32) for _ in range(2))
  f = jax.jit(lambda x, y: bp.ffi_call(AXPY, S(x.shape, x.dtype),
                                       signature="(c,d,...,n),(c,d,...,n)->(c,d,...,n)")(
      x, y, alpha=2.0))
  xs, ys = put(x, mesh8, P(None, None, "x")), put(y, mesh8, P(None, None, "x"))
  text = f.lower(xs, ys).compile().as_text()
  assert local_shapes(the_custom_call(text, AXPY)) == [(3, 2, 2, 5)] * 2
  assert collective_kinds(text) == set()
  out = f(xs, ys)
  assert tuple(out.sharding.spec)[:3] == (None, None, "x")
  assert_close(out, 2 * x + y)


@pytest.mark.timeout(120)
def test_vmap_adds_a_batch_dim_at_the_ellipsis(partitioner, mesh8):
  x, y = operands(3)
  xv = np.stack([x, 2 * x, 3 * x], axis=1)       # mapped at dim 1 (a core dim's place)
  f = jax.jit(jax.vmap(mid, in_axes=(1, None), out_axes=0))
  xs = put(xv, mesh8, P(None, None, None, "x"))   # the batch dim of size 16
  text = f.lower(xs, y).compile().as_text()
  call = the_custom_call(text, CORE_SUM)
  # One call with batch (3, 16, 4) after x's two leading core dims.
  assert local_shapes(call)[0] == (2, 3, 3, 2, 4, 5)
  assert collective_kinds(text) <= {"all-to-all"} and len(text.split("custom-call(")) == 2
  out = np.asarray(f(xs, y))
  for k in range(3):
    assert_close(out[k], mid_reference((k + 1) * x, y))
  # vmap of the unmapped-x, mapped-y case: y gets the new dim, x broadcasts.
  yv = np.stack([y, -y], axis=0)
  g = jax.jit(jax.vmap(mid, in_axes=(None, 0)))
  out = np.asarray(g(x, yv))
  assert_close(out[1], mid_reference(x, -y))


@pytest.mark.timeout(120)
def test_grad_through_custom_vjp(partitioner, mesh8):
  @jax.custom_vjp
  def f(x, y):
    return mid(x, y)

  def fwd(x, y):
    return mid(x, y), (x.shape, y.shape)

  def bwd(shapes, g):
    # d out[p, f, b] / d x[a, f', b, r] = 1 and likewise for y (broadcast).
    ds = g.sum(axis=(0, 1))                                  # per batch element
    dx = jnp.broadcast_to(ds[None, None, :, :, None], shapes[0])
    dy = jnp.broadcast_to(ds.sum(axis=0)[None, :], shapes[1])
    return dx, dy

  f.defvjp(fwd, bwd)
  x, y = operands(4)
  w = np.random.default_rng(5).standard_normal(OUT_SHAPE).astype(np.float32)
  loss = jax.jit(jax.grad(lambda x, y: (f(x, y) ** 2 * w).sum(), argnums=(0, 1)))
  xs = put(x, mesh8, P(None, None, "x"))
  text = loss.lower(xs, y).compile().as_text()
  assert local_shapes(the_custom_call(text, CORE_SUM))[0] == (2, 3, 2, 4, 5)
  assert "all-gather" not in collective_kinds(text)
  dx, dy = loss(xs, y)
  ds = (2 * mid_reference(x, y) * w).sum(axis=(0, 1))
  assert_close(dx, np.broadcast_to(ds[None, None, :, :, None], X_SHAPE))
  assert_close(dy, np.broadcast_to(ds.sum(axis=0)[None, :], Y_SHAPE))


@pytest.mark.timeout(120)
def test_explicit_mode_types_the_batch_dims_at_the_ellipsis(partitioner):
  mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Explicit,))
  x, y = operands(6)
  x8 = np.concatenate([x] * 4)    # a = 8: a leading core dim the mesh divides
  with jax.set_mesh(mesh):
    for arr, spec in ((x, P(None, None, "x")), (x8, P("x"))):
      xs = jax.device_put(arr, NamedSharding(mesh, spec))
      f = jax.jit(lambda x, y: bp.ffi_call(CORE_SUM, S(OUT_SHAPE, x.dtype), signature=SIG)(
          x, y, **ATTRS))
      typed = jax.eval_shape(f, xs, y)
      assert typed.sharding.spec == P(None, None, "x", None), spec
      text = f.lower(xs, y).compile().as_text()
      assert "all-gather" not in collective_kinds(text)
      out = f(xs, y)
      assert out.sharding.spec == P(None, None, "x", None)
      assert_close(out, core_sum_reference(arr, y, 2, 1, 1, 0, OUT_SHAPE, 2, 0))


@pytest.mark.timeout(120)
def test_export_round_trip(mesh8):
  x, y = operands(7)
  sharding = NamedSharding(mesh8, P(None, None, "x"))
  jitted = jax.jit(lambda x, y: mid(x, y), in_shardings=(sharding, NamedSharding(mesh8, P())),
                   out_shardings=sharding)
  exported = export.export(jitted, disabled_checks=[
      export.DisabledSafetyCheck.custom_call(CORE_SUM)])(
          S(X_SHAPE, np.float32, sharding=sharding),
          S(Y_SHAPE, np.float32, sharding=NamedSharding(mesh8, P())))
  assert "$po2,1$pr2" in exported.mlir_module()
  restored = export.deserialize(exported.serialize())
  f = jax.jit(restored.call)
  xs = put(x, mesh8, P(None, None, "x"))
  assert_batch_split(f, x, y, xs, put(y, mesh8, P()))


def _core_sum_primitive(name, register):
  p = compat.Primitive(name)
  p.def_abstract_eval(lambda x, y, **_: compat.ShapedArray(OUT_SHAPE, x.dtype))
  register(p)
  return p


_ADOPTED = _core_sum_primitive("anywhere_core_sum_adopted", lambda p: mlir.register_lowering(
    p, jax.ffi.ffi_lowering(CORE_SUM)))
bp.partition_primitive(_ADOPTED, signature=SIG)
_LOWERED = _core_sum_primitive("anywhere_core_sum_lowered", lambda p: mlir.register_lowering(
    p, bp.ffi_lowering(CORE_SUM, signature=SIG)))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("primitive", [_ADOPTED, _LOWERED], ids=["partition_primitive",
                                                                 "ffi_lowering"])
def test_adopted_primitives(partitioner, mesh8, primitive):
  x, y = operands(8)
  f = jax.jit(functools.partial(primitive.bind, **ATTRS))
  assert_batch_split(f, x, y, put(x, mesh8, P(None, None, "x")))


@pytest.mark.timeout(120)
def test_decorator(partitioner, mesh8):
  @bp.batch_partitionable(signature=SIG)
  def wrapper(x, y):
    return jax.ffi.ffi_call(CORE_SUM, S(OUT_SHAPE, x.dtype))(x, y, **ATTRS)

  x, y = operands(9)
  assert_batch_split(jax.jit(wrapper), x, y, put(x, mesh8, P(None, None, "x")))


@pytest.mark.timeout(120)
def test_explain_reads_the_batch_dims_behind_the_leading_core_dims(partitioner, mesh8):
  x, y = operands(10)
  report = bp.explain(mid, put(x, mesh8, P(None, None, "x")), y)
  (call,) = report.calls
  assert call.num_batch_dims == 2
  assert call.leading_core_dims == ((2, 1), (2,))
  assert call.device_result_shapes == ((2, 3, 2, 4),)
  assert call.replication == 1     # read on dims 2 and 3, not the core dims 0 and 1
  assert "after leading core dims (signature '...'): operands (2, 1), results (2)" in flat(
      str(report))
  # Replicated input: every device computes everything.
  (call,) = bp.explain(mid, put(x, mesh8, P()), y).calls
  assert call.replication == 8


@pytest.mark.timeout(120)
def test_partition_ffi_target(partitioner, mesh8):
  """A package's plain jax.ffi.ffi_call with batch dims in the middle."""
  def package(x, y):
    return jax.ffi.ffi_call(CORE_SUM, S(OUT_SHAPE, x.dtype))(x, y, **ATTRS)

  x, y = operands(11)
  bp.partition_ffi_target(CORE_SUM, signature=SIG)
  try:
    assert_batch_split(jax.jit(package), x, y, put(x, mesh8, P(None, None, "x")))
  finally:
    bp.unpartition(CORE_SUM)
