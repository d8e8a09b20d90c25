"""Results that keep a reduced dim, on 8 devices, under Shardy and GSPMD.

``batchpart_test_weigh_rows`` is ``(n,k),(n)->(k),(n)`` with
``reduce={"n": "sum"}``: the ``(k)`` result combines over the parts of n
(one all-reduce), the ``(n)`` result keeps n and stays split along it like
the operands, each device writing its own rows: no collective touches it.
"""

import jax
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import batchpart as bp
from batchpart import _hlo, testing as kernels

from helpers import local_shapes, put, the_custom_call

WEIGH = "batchpart_test_weigh_rows"


def data(batch=4, n=64, k=3, seed=0):
  rng = np.random.default_rng(seed)
  return (rng.standard_normal((batch, n, k)).astype(np.float32),
          rng.standard_normal((batch, n)).astype(np.float32))


def assert_weigh_close(out, x, w):
  np.testing.assert_allclose(np.asarray(out[0]), np.einsum("bn,bnk->bk", w, x),
                             rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(out[1]), w * x.sum(-1), rtol=1e-6, atol=1e-6)


def test_the_kept_result_stays_split_and_the_other_combines(partitioner, mesh2x4):
  x, w = data()
  xs, ws = put(x, mesh2x4, P("a", "b")), put(w, mesh2x4, P("a", "b"))
  f = jax.jit(kernels.weigh_rows)
  total, row = f(xs, ws)
  assert_weigh_close((total, row), x, w)
  assert row.sharding.spec == P("a", "b") and total.sharding.spec == P("a")
  text = f.lower(xs, ws).compile().as_text()
  call = the_custom_call(text, WEIGH)
  assert local_shapes(call) == [(2, 16, 3), (2, 16)]
  assert [t.shape for t in call.result_types] == [(2, 3), (2, 16)]
  (reduce,) = _hlo.collectives(text)
  assert reduce.opcode == "all-reduce" and [t.shape for t in reduce.result_types] == [(2, 3)]


def test_an_uneven_dim_is_whole_in_both_results(partitioner, mesh2x4):
  x, w = data(n=10)

  def f(x, w):
    c = lambda a: jax.lax.with_sharding_constraint(a, NamedSharding(mesh2x4, P("a", "b")))
    return kernels.weigh_rows(c(x), c(w))

  assert_weigh_close(jax.jit(f)(put(x, mesh2x4, P("a")), put(w, mesh2x4, P("a"))), x, w)


def test_explicit_mode_types_the_kept_result_split(partitioner):
  mesh = jax.make_mesh((2, 4), ("a", "b"), axis_types=(AxisType.Explicit,) * 2)
  x, w = data(seed=1)
  xs, ws = put(x, mesh, P("a", "b")), put(w, mesh, P("a", "b"))
  with jax.set_mesh(mesh):
    f = jax.jit(kernels.weigh_rows)
    out = f(xs, ws)
    assert jax.typeof(out[1]).sharding.spec == P("a", "b")   # split like the operands
    assert jax.typeof(out[0]).sharding.spec == P("a", None)
    text = f.lower(xs, ws).compile().as_text()
  assert_weigh_close(out, x, w)
  assert {c.opcode for c in _hlo.collectives(text)} == {"all-reduce"}


def _np_weigh(x, w):
  return np.einsum("...n,...nk->...k", w, x).astype(x.dtype), (w * x.sum(-1)).astype(x.dtype)


@pytest.mark.parametrize("n, spec", [(64, P("a", "b")), (10, P("a", "b")), (64, P())])
def test_a_callback_writes_its_part_of_the_kept_result(partitioner, mesh2x4, n, spec):
  """Each device's callback returns its rows of the (n) result, which stays
  split (n = 10 does not split over 4: whole; P(): one call, whole)."""
  x, w = data(n=n)
  out = (jax.ShapeDtypeStruct((4, 3), np.float32), jax.ShapeDtypeStruct((4, n), np.float32))
  f = jax.jit(lambda x, w: bp.pure_callback(_np_weigh, out, x, w,
                                            signature="(n,k),(n)->(k),(n)",
                                            reduce={"n": "sum"}))
  xs = put(x, mesh2x4, spec if n % 4 == 0 else P("a"))
  ws = put(w, mesh2x4, spec if n % 4 == 0 else P("a"))
  total, row = f(xs, ws)
  assert_weigh_close((total, row), x, w)
  if n % 4 == 0 and spec != P():
    assert row.sharding.spec == P("a", "b")
    assert "all-gather" not in {c.opcode for c in _hlo.collectives(
        f.lower(xs, ws).compile().as_text())}


def test_a_combiner_merges_the_others_while_the_kept_result_stays_split(partitioner,
                                                                         mesh2x4):
  x, w = data(seed=2)
  out = (jax.ShapeDtypeStruct((4, 3), np.float32), jax.ShapeDtypeStruct((4, 64), np.float32))
  add = bp.Combiner(lambda a, b: (a[0] + b[0],))
  f = jax.jit(bp.ffi_call(WEIGH, out, signature="(n,k),(n)->(k),(n)", reduce={"n": add}))
  xs, ws = put(x, mesh2x4, P("a", "b")), put(w, mesh2x4, P("a", "b"))
  total, row = f(xs, ws)
  assert_weigh_close((total, row), x, w)
  assert row.sharding.spec == P("a", "b")
  (gather,) = _hlo.collectives(f.lower(xs, ws).compile().as_text())
  assert gather.opcode == "all-gather" and [t.shape for t in gather.result_types] == [
      (4, 2, 3)]
