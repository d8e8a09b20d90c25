"""Named combiners on 8 devices: ``reduce={"n": "argmax" | "argmin" | "logsumexp"}``,
under Shardy and GSPMD.

``batchpart_test_arg_rows`` gives NumPy's argmax (argmin) over n and the
value there, its index local to the part it sees; ``batchpart_test_attention``
gives softmax attention over the keys n and its lse. With n sharded, each
device runs the kernel on its part and the per-device module merges the
parts with all-reduces of result-sized arrays. The values must equal NumPy's
on the whole dim exactly for argmax and argmin (ties and NaNs placed on
part boundaries, infinities), and to rounding for logsumexp (masked parts,
every part masked). The compiled program must cut n on every device and
hold no collective but all-reduces. An uneven n is kept whole (no merge,
so padding never enters one). Host callbacks combine the same way.
"""

import math

import jax
import numpy as np
import pytest
from hypothesis import given, strategies as st
from jax.sharding import NamedSharding, PartitionSpec as P

import batchpart as bp
from batchpart import _hlo, testing as kernels

import helpers
from helpers import collective_kinds, flat, local_shapes, put, the_custom_call

ARG = "batchpart_test_arg_rows"
ATTENTION = "batchpart_test_attention"


pytestmark = pytest.mark.usefixtures("x64")


def numpy_arg(x, op):
  """NumPy's (value, index) over the last dim."""
  index = (np.argmax if op == "argmax" else np.argmin)(x, axis=-1)
  return np.take_along_axis(x, index[..., None], -1)[..., 0], index


def assert_arg_equal(out, x, op):
  value, index = numpy_arg(x, op)
  np.testing.assert_array_equal(np.asarray(out[1]), index)
  np.testing.assert_array_equal(np.asarray(out[0]), value)   # NaN == NaN here
  assert out[1].dtype == np.int32 and out[0].dtype == x.dtype


def arg_rows_data(dtype, batch=4, n=64, parts=4, seed=0):
  """Rows with ties and extremes placed on part boundaries: row 0 ties its
  maximum and minimum at the last element of part 0 and the first of part
  1; row 1 has NaNs at the first elements of parts 1 and 2 (floats; for
  int32 the dtype's extremes); row 2 has +inf and -inf in two parts; row 3
  is constant (every index ties)."""
  rng = np.random.default_rng(seed)
  x = rng.integers(-50, 50, (batch, n)).astype(dtype)
  step = n // parts
  floats = np.dtype(dtype).kind == "f"
  top = np.inf if floats else np.iinfo(dtype).max
  x[0, [step - 1, step]] = 99
  x[0, [step - 2, step + 1]] = -99
  if floats:
    x[1, [step, 2 * step]] = np.nan
  else:
    x[1, [step, 2 * step]] = top
  x[2, [step + 3, 3 * step]] = [top, -top]
  x[3] = 7
  return x


@pytest.mark.parametrize("op", ["argmax", "argmin"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
def test_arg_values_equal_numpy_on_the_whole_dim(partitioner, mesh2x4, op, dtype):
  x = arg_rows_data(dtype)
  xs = put(x, mesh2x4, P("a", "b"))
  f = jax.jit(lambda x: kernels.arg_rows(x, op))
  assert_arg_equal(f(xs), x, op)
  text = f.lower(xs).compile().as_text()
  assert local_shapes(the_custom_call(text, ARG)) == [(2, 16)]
  assert collective_kinds(text) == {"all-reduce"}
  # The value, a NaN flag (floats only) and the lowest global index.
  assert len(_hlo.collectives(text)) == (3 if np.dtype(dtype).kind == "f" else 2)


@pytest.mark.parametrize("op", ["argmax", "argmin"])
def test_arg_over_both_axes_and_first_nan(partitioner, mesh2x4, op):
  """n over all 8 devices (part offsets from both mesh axes), the first NaN
  in the last part's predecessor."""
  x = arg_rows_data(np.float32, batch=4, n=64, parts=8, seed=1)
  x[2, 63] = np.nan
  x[2, 41] = np.nan
  xs = put(x, mesh2x4, P(None, ("a", "b")))
  assert_arg_equal(jax.jit(lambda x: kernels.arg_rows(x, op))(xs), x, op)


@pytest.mark.parametrize("op", ["argmax", "argmin"])
def test_uneven_dim_is_kept_whole(partitioner, mesh2x4, op):
  x = arg_rows_data(np.float32, batch=4, n=10, parts=3, seed=2)
  xs = put(x, mesh2x4, P("a"))

  def f(x):
    x = jax.lax.with_sharding_constraint(x, NamedSharding(mesh2x4, P("a", "b")))
    return kernels.arg_rows(x, op)

  assert_arg_equal(jax.jit(f)(xs), x, op)
  text = jax.jit(f).lower(xs).compile().as_text()
  assert local_shapes(the_custom_call(text, ARG))[0][1] == 10   # n whole: nothing to merge


def attention_data(batch=2, nq=3, n=32, d=4, e=5, dtype=np.float32, seed=0):
  rng = np.random.default_rng(seed)
  q, k = (rng.standard_normal((batch, m, d)).astype(dtype) for m in (nq, n))
  v = rng.standard_normal((batch, n, e)).astype(dtype)
  bias = np.zeros((batch, n), dtype)
  return q, k, v, bias


def assert_attention_close(out, q, k, v, bias):
  o, lse = kernels.attention_reference(q, k, v, bias)
  tol = 2e-5 if q.dtype == np.float32 else 1e-12
  assert not np.isnan(np.asarray(out[0])).any() and not np.isnan(np.asarray(out[1])).any()
  np.testing.assert_allclose(np.asarray(out[0]), o, rtol=tol, atol=tol)
  np.testing.assert_allclose(np.asarray(out[1]), lse, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_attention_with_masked_parts(partitioner, mesh2x4, dtype):
  """Batch 0 has parts 1 and 3 of 4 fully masked; batch 1 has every key
  masked (o = 0, lse = -inf, no NaN)."""
  q, k, v, bias = attention_data(dtype=dtype)
  bias[0, 8:16] = -np.inf
  bias[0, 24:32] = -np.inf
  bias[1] = -np.inf
  args = [put(q, mesh2x4, P("a")), put(k, mesh2x4, P("a", "b")),
          put(v, mesh2x4, P("a", "b")), put(bias, mesh2x4, P("a", "b"))]
  f = jax.jit(kernels.attention)
  out = f(*args)
  assert_attention_close(out, q, k, v, bias)
  assert np.all(np.asarray(out[1])[1] == -np.inf) and np.all(np.asarray(out[0])[1] == 0)
  text = f.lower(*args).compile().as_text()
  assert local_shapes(the_custom_call(text, ATTENTION)) == [(1, 3, 4), (1, 8, 4), (1, 8, 5),
                                                           (1, 8)]
  assert collective_kinds(text) == {"all-reduce"}


def test_explicit_mode_types_the_results_unsharded_over_the_dim(partitioner, explicit_mesh2x4):
  mesh = explicit_mesh2x4
  q, k, v, bias = attention_data(seed=3)
  x = arg_rows_data(np.float32, batch=4, n=64)
  with jax.set_mesh(mesh):
    args = [put(q, mesh, P("a")), put(k, mesh, P("a", "b")), put(v, mesh, P("a", "b")),
            put(bias, mesh, P("a", "b"))]
    o, lse = jax.jit(kernels.attention)(*args)
    assert jax.typeof(o).sharding.spec == P("a", None, None)
    assert jax.typeof(lse).sharding.spec == P("a", None)
    value, index = jax.jit(lambda x: kernels.arg_rows(x, "argmax"))(put(x, mesh, P("a", "b")))
    assert jax.typeof(index).sharding.spec == P("a")
  assert_attention_close((o, lse), q, k, v, bias)
  assert_arg_equal((value, index), x, "argmax")


def test_explain_names_the_combine_and_marks_its_all_reduces(partitioner, mesh2x4):
  x = put(arg_rows_data(np.float32), mesh2x4, P("a", "b"))
  f = lambda x: kernels.arg_rows(x, "argmax")
  text = str(bp.explain(f, x))
  assert ("n (size 64) by argmax, in 4 parts, one per device of each all-reduce group, "
          "merged by all-reduces of the largest value, a NaN flag and the lowest global "
          "index") in flat(text)
  (call,) = bp.explain(f, x).calls
  assert [(c.kind, c.declared_reduction) for c in call.collectives_after] == [
      ("all-reduce", True)] * 3
  assert call.collectives_before == ()

  q, k, v, bias = attention_data()
  args = [put(q, mesh2x4, P("a")), *(put(a, mesh2x4, P("a", "b")) for a in (k, v, bias))]
  report = bp.explain(kernels.attention, *args)
  assert "n (size 32) by logsumexp, in 4 parts" in str(report)
  assert "merged by all-reduces of the largest lse" in str(report)
  assert all(c.kind == "all-reduce" and c.declared_reduction
             for c in report.calls[0].collectives_after)


# ---- host callbacks -------------------------------------------------------------------

def _np_argmin(x):
  i = np.argmin(x, axis=-1)
  return np.take_along_axis(x, i[..., None], -1)[..., 0], i.astype(np.int64)


def _np_attention(q, k, v, bias):
  o, lse = kernels.attention_reference(q, k, v, bias)
  return o.astype(q.dtype), lse.astype(q.dtype)


def test_pure_callback_argmin_and_logsumexp(partitioner, mesh2x4):
  x = arg_rows_data(np.float64, seed=4)
  xs = put(x, mesh2x4, P("a", "b"))
  out = jax.jit(lambda x: bp.pure_callback(
      _np_argmin, (jax.ShapeDtypeStruct(x.shape[:-1], x.dtype),
                   jax.ShapeDtypeStruct(x.shape[:-1], np.int64)),
      x, signature="(n)->(),()", reduce={"n": "argmin"}))(xs)
  value, index = numpy_arg(x, "argmin")
  np.testing.assert_array_equal(np.asarray(out[1]), index)
  np.testing.assert_array_equal(np.asarray(out[0]), value)

  q, k, v, bias = attention_data(seed=5)
  bias[1, :16] = -np.inf
  args = [put(q, mesh2x4, P("a")), put(k, mesh2x4, P("a", "b")),
          put(v, mesh2x4, P("a", "b")), put(bias, mesh2x4, P("a", "b"))]
  f = jax.jit(lambda q, k, v, bias: bp.pure_callback(
      _np_attention, (jax.ShapeDtypeStruct((*q.shape[:-1], v.shape[-1]), q.dtype),
                      jax.ShapeDtypeStruct(q.shape[:-1], q.dtype)),
      q, k, v, bias, signature="(q,d),(n,d),(n,e),(n)->(q,e),(q)",
      reduce={"n": "logsumexp"}))
  assert_attention_close(f(*args), q, k, v, bias)
  assert "all-gather" not in collective_kinds(f.lower(*args).compile().as_text())


# ---- property test ---------------------------------------------------------------------

@pytest.mark.timeout(600)
@helpers.property_settings(40)
@given(data=st.data())
def test_drawn_meshes_shardings_and_sizes(partitioner, data):
  """Values equal NumPy (exactly for argmax/argmin, to rounding for
  logsumexp) on drawn 1-D and 2-D meshes, shardings and sizes (uneven ones
  included), and no collective but all-reduces runs after a call whose n
  splits evenly."""
  mesh = helpers.draw_mesh(data, helpers.MESH_SHAPES[:3])
  B = data.draw(st.sampled_from([1, 2, 3, 4, 8]), label="B")
  n = data.draw(st.sampled_from([1, 3, 4, 8, 10, 16, 24]), label="n")
  op = data.draw(st.sampled_from(["argmax", "argmin", "logsumexp"]), label="op")
  spec = helpers.random_spec(data, mesh, 2, "x", shuffle=True)
  seed = data.draw(st.integers(0, 2**16), label="seed")
  rng = np.random.default_rng(seed)
  if op == "logsumexp":
    q, k, v, bias = attention_data(batch=B, n=n, seed=seed)
    bias[rng.random((B, n)) < 0.4] = -np.inf
    operand_specs = [P(spec[0]), P(*spec), P(*spec), P(*spec)]
    operands = (q, k, v, bias)
    call = kernels.attention
  else:
    x = rng.integers(-3, 3, (B, n)).astype(np.float32)   # many ties
    x[rng.random((B, n)) < 0.1] = np.nan
    operand_specs, operands = [P(*spec)], (x,)
    call = lambda x: kernels.arg_rows(x, op)
  f, args = helpers.constrained_call(mesh, operand_specs, call, *operands)
  out = f(*args)
  if op == "logsumexp":
    assert_attention_close(out, *operands)
  else:
    assert_arg_equal(out, operands[0], op)
  parts, batch_parts = (math.prod(mesh.shape[a] for a in _axes(entry)) for entry in
                        (spec[1], spec[0]))
  if parts > 1 and n % parts == 0:
    text = jax.jit(f).lower(*args).compile().as_text()
    target = ATTENTION if op == "logsumexp" else ARG
    assert local_shapes(the_custom_call(text, target))[1 if op == "logsumexp" else 0][1] == \
        n // parts
    if B % batch_parts == 0:   # else the padded results are gathered for the output
      assert collective_kinds(text) == {"all-reduce"}


def _axes(entry) -> tuple:
  return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


def test_vmap_keeps_the_combine(partitioner, mesh2x4):
  x = arg_rows_data(np.float32, batch=4, n=64)
  xs = put(x.reshape(2, 2, 64), mesh2x4, P(None, "a", "b"))
  out = jax.jit(jax.vmap(lambda x: kernels.arg_rows(x, "argmax")))(xs)
  value, index = numpy_arg(x, "argmax")
  np.testing.assert_array_equal(np.asarray(out[1]).reshape(-1), index)
  np.testing.assert_array_equal(np.asarray(out[0]).reshape(-1), value)
