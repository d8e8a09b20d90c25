"""bp.pure_callback(reduce=...) on 8 simulated devices, Shardy and GSPMD:
each device calls the function on its own part of the reduced dim (and its
own batch block), one all-reduce over exactly the devices holding the parts
combines the results, and the values equal NumPy's on the whole array.
Hypothesis draws meshes, shardings of the batch and reduced dims, sizes and
the op."""

import threading

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import batchpart as bp
from batchpart import _hlo

from helpers import collective_kinds, compiled_text, local_shapes, put, rng

CPU_CALLBACK = "xla_ffi_python_cpu_callback"
S = jax.ShapeDtypeStruct
NP_OPS = {"sum": np.sum, "max": np.max, "min": np.min}


class Parts:
  """A reduction's callback that records the block shapes it was called on."""

  def __init__(self, op="sum"):
    self.op, self.shapes, self.lock = op, [], threading.Lock()

  def __call__(self, x):
    with self.lock:
      self.shapes.append(x.shape)
    return NP_OPS[self.op](x, axis=-2)


def _column_op(fn, x, op):
  return bp.pure_callback(fn, S(x.shape[:-2] + x.shape[-1:], x.dtype), x,
                          signature="(n,k)->(k)", reduce={"n": op})


@pytest.mark.timeout(120)
def test_2x4_batch_on_one_axis_reduced_dim_on_the_other(partitioner, mesh2x4):
  x = rng(0).normal(size=(4, 64, 3)).astype(np.float32)
  parts = Parts()
  f = lambda x: _column_op(parts, x, "sum")
  xs = put(x, mesh2x4, P("a", "b", None))
  text = compiled_text(f, xs)
  (call,) = _hlo.custom_calls(text, CPU_CALLBACK)
  # The block vector (batch offset and size, n's part start and size), then
  # the local block: half the batch, a quarter of n.
  assert local_shapes(call) == [(4,), (2, 16, 3)]
  (reduce,) = [c for c in _hlo.collectives(text)]
  assert reduce.opcode == "all-reduce"
  assert "{{0,1,2,3},{4,5,6,7}}" in text
  y = jax.jit(f)(xs)
  assert y.sharding.spec == P("a")
  np.testing.assert_allclose(y, x.sum(axis=1), rtol=1e-5, atol=1e-5)
  assert sorted(parts.shapes) == [(2, 16, 3)] * 8


@pytest.mark.timeout(120)
@pytest.mark.parametrize("op", ["sum", "max", "min"])
def test_log_likelihood_over_sharded_data(partitioner, mesh8, op):
  data = rng(1).normal(size=(1024, 3))
  seen = []

  def loglik(d):
    seen.append(d.shape)
    v = -0.5 * (d ** 2).sum(-1)
    return np.asarray(NP_OPS[op](v), d.dtype)

  f = lambda d: bp.pure_callback(loglik, S((), d.dtype), d, signature="(n,k)->()",
                                 reduce={"n": op})
  ds = put(data.astype(np.float32), mesh8, P("x"))
  assert collective_kinds(compiled_text(f, ds)) == {"all-reduce"}
  got = float(jax.jit(f)(ds))
  want = NP_OPS[op](-0.5 * (data.astype(np.float32) ** 2).sum(-1))
  np.testing.assert_allclose(got, want, rtol=1e-5)
  assert sorted(seen) == [(128, 3)] * 8


@pytest.mark.timeout(120)
def test_a_call_with_no_batch_dims_in_explicit_mode(partitioner):
  # The call gets a unit batch dim while lowering; its Explicit-mode
  # sharding must move with the dims it names.
  mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Explicit,))
  data = rng(2).normal(size=(1024, 3)).astype(np.float32)
  seen = Parts()
  f = jax.jit(lambda d: bp.pure_callback(lambda d: seen(d).sum(), S((), d.dtype), d,
                                         signature="(n,k)->()", reduce={"n": "sum"}))
  with jax.set_mesh(mesh):
    ds = put(data, mesh, P("x"))
    got = f(ds)
    assert collective_kinds(compiled_text(f, ds)) == {"all-reduce"}
  np.testing.assert_allclose(float(got), data.sum(), rtol=1e-4)
  assert sorted(seen.shapes) == [(128, 3)] * 8


@pytest.mark.timeout(120)
def test_not_sharded_reduced_dim_calls_on_whole_rows(partitioner, mesh8):
  x = rng(2).normal(size=(8, 10, 3)).astype(np.float32)
  parts = Parts("max")
  f = lambda x: _column_op(parts, x, "max")
  xs = put(x, mesh8, P("x"))
  assert collective_kinds(compiled_text(f, xs)) == set()
  np.testing.assert_array_equal(jax.jit(f)(xs), x.max(axis=1))
  assert sorted(parts.shapes) == [(1, 10, 3)] * 8


def test_io_callback_refuses_reduce():
  with pytest.raises(ValueError, match=r"io_callback\(.*reduce= is not supported"):
    bp.io_callback(lambda x: x.sum(0), S((3,), np.float32), np.zeros((4, 3), np.float32),
                   signature="(n,k)->(k)", reduce={"n": "sum"})


def test_reduce_needs_a_named_operand_dim():
  with pytest.raises(ValueError, match=r"pure_callback\(.*'3', which is not a named core dim"):
    bp.pure_callback(lambda x: x.sum(0), S((3,), np.float32), np.zeros((4, 3), np.float32),
                     signature="(n,3)->(3)", reduce={"3": "sum"})


@st.composite
def _case(draw):
  shape = draw(st.sampled_from([(8,), (2, 4), (4, 2), (2, 2, 2)]))
  names = ("p", "q", "r")[:len(shape)]
  roles = draw(st.lists(st.sampled_from("bnr"), min_size=len(shape), max_size=len(shape)))
  on = lambda role: tuple(a for a, r in zip(names, roles) if r == role)
  tiles = lambda role: int(np.prod([s for s, r in zip(shape, roles) if r == role]))
  batch = tiles("b") * draw(st.integers(1, 2))
  n = tiles("n") * draw(st.integers(1, 3)) + draw(st.sampled_from([0, 0, 1]))
  op = draw(st.sampled_from(["sum", "max", "min"]))
  return shape, names, on("b"), on("n"), batch, n, op


@pytest.mark.timeout(600)
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=_case())
def test_drawn_meshes_and_shardings(partitioner, case):
  shape, names, batch_axes, n_axes, batch, n, op = case
  mesh = jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(shape))
  x = rng(batch * 31 + n).normal(size=(batch, n, 2)).astype(np.float32)
  parts = Parts(op)
  entry = lambda axes: axes if len(axes) > 1 else (axes[0] if axes else None)

  def f(x):
    x = jax.lax.with_sharding_constraint(
        x, NamedSharding(mesh, P(entry(batch_axes), entry(n_axes), None)))
    return _column_op(parts, x, op)

  got = jax.jit(f)(x)
  np.testing.assert_allclose(got, NP_OPS[op](x, axis=1), rtol=1e-5, atol=1e-5)
  n_parts = int(np.prod([mesh.shape[a] for a in n_axes]))
  if n_parts > 1 and n % n_parts == 0:
    (call,) = _hlo.custom_calls(compiled_text(f, x), CPU_CALLBACK)
    assert local_shapes(call)[1][1] == n // n_parts
    # Every part of n was passed exactly once per batch row.
    rows = sum(s[0] * s[1] for s in parts.shapes)
    assert rows == batch * n
    assert all(s[1] == n // n_parts for s in parts.shapes)
