"""bp.explain on calls with reduced dims (reduce=), under Shardy and GSPMD:
the all-reduce that combines the parts is reported as the declared reduction
with its bytes, the reduced dim's parts are counted as shared work, and a
reduced dim that could not stay split is reported as such."""

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

import batchpart as bp
from batchpart import testing as kernels

from helpers import compiled_text, flat, put, rng

TARGET = "batchpart_test_reduce_rows"


def _call(report):
  (call,) = [c for c in report.calls if c.target == TARGET]
  return call


def test_declared_all_reduce_and_parts_on_2x4(partitioner, mesh2x4):
  x = put(rng(0).normal(size=(4, 64, 3)).astype(np.float32), mesh2x4, P("a", "b", None))
  w = put(rng(1).normal(size=(4, 64)).astype(np.float32), mesh2x4, P("a", "b"))
  f = lambda x, w: kernels.reduce_rows(x, w, "sum")
  call = _call(bp.explain(f, x, w))
  assert call.device_operand_shapes == ((2, 16, 3), (2, 16))
  assert call.collectives_before == ()
  (after,) = call.collectives_after
  assert after.kind == "all-reduce" and after.declared_reduction
  assert after.bytes == 2 * 3 * 4   # one per-device result, f32[2,3]
  (reduced,) = call.reduced_dims
  assert (reduced.name, reduced.op, reduced.size, reduced.parts) == ("n", "sum", 64, 4)
  assert call.replication == 1
  text = str(bp.explain(f, x, w))
  assert "all-reduce 24 B (the declared reduction)" in text
  assert "n (size 64) by sum, in 4 parts" in text
  # The report agrees with the compiled program: one all-reduce, nothing else.
  assert compiled_text(f, x, w).count(" all-reduce(") == 1


def test_unsharded_reduced_dim_is_whole_and_nothing_is_combined(partitioner, mesh8):
  x = put(rng(2).normal(size=(8, 16, 3)).astype(np.float32), mesh8, P("x"))
  w = put(rng(3).normal(size=(8, 16)).astype(np.float32), mesh8, P("x"))
  call = _call(bp.explain(lambda x, w: kernels.reduce_rows(x, w, "max"), x, w))
  assert call.collectives_after == ()
  assert call.reduced_dims[0].parts == 1
  assert call.replication == 1
  assert "n (size 16) by max, whole on every device" in str(
      bp.explain(lambda x, w: kernels.reduce_rows(x, w, "max"), x, w))


def test_uneven_reduced_dim_is_reported_resharded(partitioner, mesh2x4):
  x = rng(4).normal(size=(4, 10, 3)).astype(np.float32)
  w = rng(5).normal(size=(4, 10)).astype(np.float32)

  def f(x, w):
    x = jax.lax.with_sharding_constraint(x, NamedSharding(mesh2x4, P("a", "b", None)))
    w = jax.lax.with_sharding_constraint(w, NamedSharding(mesh2x4, P("a", "b")))
    return kernels.reduce_rows(x, w, "min")

  call = _call(bp.explain(f, x, w))
  assert call.reduced_dims[0].parts == 1
  assert not any(c.declared_reduction for c in call.collectives_after)
  assert "resharded by the collectives before the call" in flat(str(bp.explain(f, x, w)))
  np.testing.assert_array_equal(jax.jit(f)(x, w), kernels.reduce_rows_reference(x, w, "min"))
