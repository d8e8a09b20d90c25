"""``reduce={"n": "max_k" | "min_k"}`` on 8 devices, under Shardy and GSPMD.

``batchpart_test_top_k_rows`` gives the k best values of n and their
indices, local to the part it sees. With n sharded, each device runs the
kernel on its part, the per-device module gathers every part's k
candidates with global indices and keeps the k best: the values and
indices must equal a stable NumPy sort of the whole dim exactly (NaNs,
infinities and ties placed on part boundaries). Parts smaller than k keep
the dim whole rather than merge fewer candidates than the answer needs.
"""

import jax
import numpy as np
import pytest
from hypothesis import given, strategies as st
from jax.sharding import PartitionSpec as P

import batchpart as bp
from batchpart import _hlo, testing as kernels

import helpers
from helpers import collective_kinds, local_shapes, put, the_custom_call

TOP_K = "batchpart_test_top_k_rows"


pytestmark = pytest.mark.usefixtures("x64")


def boundary_rows(dtype, batch=4, n=64, parts=4, seed=0):
  """Row 0 ties its largest and smallest values across the boundary of
  parts 0 and 1; row 1 has NaNs (floats) or the dtype's extremes in parts 1
  and 2; row 2 has +inf and -inf; row 3 is constant (every index ties)."""
  rng = np.random.default_rng(seed)
  x = rng.integers(-50, 50, (batch, n)).astype(dtype)
  step = n // parts
  floats = np.dtype(dtype).kind == "f"
  top = np.inf if floats else np.iinfo(dtype).max
  x[0, [step - 1, step, 3 * step]] = 99
  x[0, [step - 2, step + 1]] = -99
  x[1, [step, 2 * step, 2 * step + 1]] = np.nan if floats else top
  x[2, [step + 3, 3 * step]] = [top, -top]
  x[3] = 7
  return x


def assert_top_k_equal(out, x, k, op):
  values, index = kernels.top_k_reference(x, k, op)
  np.testing.assert_array_equal(np.asarray(out[1]), index)
  np.testing.assert_array_equal(np.asarray(out[0]), values)   # NaN == NaN here
  assert out[1].dtype == np.int32 and out[0].dtype == x.dtype


@pytest.mark.parametrize("op", ["max_k", "min_k"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
def test_values_equal_a_stable_sort_of_the_whole_dim(partitioner, mesh2x4, op, dtype):
  x = boundary_rows(dtype)
  xs = put(x, mesh2x4, P("a", "b"))
  f = jax.jit(lambda x: kernels.top_k_rows(x, 5, op))
  assert_top_k_equal(f(xs), x, 5, op)
  text = f.lower(xs).compile().as_text()
  assert local_shapes(the_custom_call(text, TOP_K)) == [(2, 16)]
  # One all-gather of k candidates per part (values and indices together),
  # never the operand.
  (gather,) = _hlo.collectives(text)
  assert gather.opcode == "all-gather"
  assert collective_kinds(text) == {"all-gather"}
  assert [t.shape for t in gather.result_types] == [(4, 2, 5)] * 2   # 4 parts x k = 5


@pytest.mark.parametrize("op", ["max_k", "min_k"])
def test_over_all_eight_devices(partitioner, mesh2x4, op):
  x = boundary_rows(np.float32, batch=4, n=64, parts=8, seed=1)
  xs = put(x, mesh2x4, P(None, ("a", "b")))
  assert_top_k_equal(jax.jit(lambda x: kernels.top_k_rows(x, 8, op))(xs), x, 8, op)


@pytest.mark.parametrize("k, whole", [(8, False), (9, True)])
def test_parts_smaller_than_k_keep_the_dim_whole(partitioner, mesh8, k, whole):
  x = boundary_rows(np.float32, batch=4, n=64, parts=8, seed=2)
  xs = put(x, mesh8, P(None, "x"))
  f = jax.jit(lambda x: kernels.top_k_rows(x, k))
  assert_top_k_equal(f(xs), x, k, "max_k")
  text = f.lower(xs).compile().as_text()
  assert local_shapes(the_custom_call(text, TOP_K))[0][-1] == (64 if whole else 8)


def test_explain_names_the_merge(partitioner, mesh2x4):
  x = put(boundary_rows(np.float32), mesh2x4, P("a", "b"))
  report = bp.explain(lambda x: kernels.top_k_rows(x, 3), x)
  assert ("n (size 64) by max_k, in 4 parts" in str(report)
          and "merged by an all-gather of each part's k largest values" in str(report))
  assert [(c.kind, c.declared_reduction) for c in report.calls[0].collectives_after] == [
      ("all-gather", True)]


def test_explicit_mode_types_the_results_unsharded_over_the_dim(partitioner, explicit_mesh2x4):
  mesh = explicit_mesh2x4
  x = boundary_rows(np.float64)
  with jax.set_mesh(mesh):
    values, index = jax.jit(lambda x: kernels.top_k_rows(x, 4, "min_k"))(
        put(x, mesh, P("a", "b")))
    assert jax.typeof(index).sharding.spec == P("a", None)
  assert_top_k_equal((values, index), x, 4, "min_k")


def _np_top_k(x, k):
  values, index = kernels.top_k_reference(x, k, "max_k")
  return values, index.astype(np.int64)


def test_pure_callback_max_k(partitioner, mesh2x4):
  x = boundary_rows(np.float64, seed=4)
  xs = put(x, mesh2x4, P("a", "b"))
  f = jax.jit(lambda x: bp.pure_callback(
      lambda x: _np_top_k(x, 3),
      (jax.ShapeDtypeStruct((*x.shape[:-1], 3), x.dtype),
       jax.ShapeDtypeStruct((*x.shape[:-1], 3), np.int64)),
      x, signature="(n)->(k),(k)", reduce={"n": "max_k"}))
  values, index = f(xs)
  expected_values, expected_index = kernels.top_k_reference(x, 3)
  np.testing.assert_array_equal(np.asarray(index), expected_index)
  np.testing.assert_array_equal(np.asarray(values), expected_values)
  assert collective_kinds(f.lower(xs).compile().as_text()) <= {"all-gather"}


@pytest.mark.timeout(600)
@helpers.property_settings(25)
@given(data=st.data())
def test_drawn_meshes_shardings_sizes_and_k(partitioner, data):
  """Values equal the stable NumPy sort on drawn meshes, shardings, sizes
  (uneven ones too) and k (up to the whole dim, near the part size)."""
  mesh = helpers.draw_mesh(data)
  B = data.draw(st.sampled_from([1, 2, 3, 4]), label="B")
  n = data.draw(st.sampled_from([3, 8, 10, 16, 24]), label="n")
  k = data.draw(st.integers(1, n), label="k")
  op = data.draw(st.sampled_from(["max_k", "min_k"]), label="op")
  spec = helpers.random_spec(data, mesh, 2, "x", shuffle=True)
  rng = np.random.default_rng(data.draw(st.integers(0, 2**16), label="seed"))
  x = rng.integers(-3, 3, (B, n)).astype(np.float32)   # many ties
  x[rng.random((B, n)) < 0.1] = np.nan
  f, args = helpers.constrained_call(mesh, [spec], lambda x: kernels.top_k_rows(x, k, op), x)
  assert_top_k_equal(f(*args), x, k, op)


def test_vmap_keeps_the_merge(partitioner, mesh2x4):
  x = boundary_rows(np.float32, seed=5)
  stacked = put(x.reshape(2, 2, 64), mesh2x4, P(None, "a", "b"))
  values, index = jax.jit(jax.vmap(lambda x: kernels.top_k_rows(x, 4)))(stacked)
  assert_top_k_equal((np.asarray(values).reshape(4, 4), np.asarray(index).reshape(4, 4)),
                     x, 4, "max_k")
