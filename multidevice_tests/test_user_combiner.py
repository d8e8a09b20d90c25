"""``reduce={"n": bp.Combiner(merge, index_results=...)}`` on 8 devices,
under Shardy and GSPMD.

Each device runs the call on its part of n; the per-device module gathers
every part's combining results (one all-gather, never an operand) and folds
them with the user's jnp merge in part order, vmapped over the batch dims.
Values against NumPy on the whole dim: an argmax written as a merge (index
results offset to global, the first index wins: order matters), a Welford
(count, mean, M2) merge, and attention's (o, lse) merge; over two dims (the
grid of parts folded in order, the first dim major) and with core dims
before the batch dims.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, strategies as st
from jax.sharding import AxisType, Mesh, PartitionSpec as P

import batchpart as bp
from batchpart import _hlo, testing as kernels
from batchpart.testing import layouts

import helpers
from helpers import flat, local_shapes, put, the_custom_call

ARG = "batchpart_test_arg_rows"


pytestmark = pytest.mark.usefixtures("x64")


def first_max(a, b):
  """NumPy's argmax as a merge: b wins only with a strictly larger value, so
  among ties the earlier part (lower global index) keeps it."""
  (va, ia), (vb, ib) = a, b
  take_b = vb > va
  return jnp.where(take_b, vb, va), jnp.where(take_b, ib, ia)


FIRST_MAX = bp.Combiner(first_max, index_results=(1,))


def last_max(a, b):
  (va, ia), (vb, ib) = a, b
  take_b = vb >= va
  return jnp.where(take_b, vb, va), jnp.where(take_b, ib, ia)


def user_argmax(x, combiner=FIRST_MAX):
  out = (jax.ShapeDtypeStruct(x.shape[:-1], x.dtype),
         jax.ShapeDtypeStruct(x.shape[:-1], np.int32))
  return bp.ffi_call(ARG, out, signature="(n)->(),()", reduce={"n": combiner})(
      x, op=np.int64(0))


def ties(batch=4, n=64, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.integers(-5, 5, (batch, n)).astype(np.float32)
  x[0, [15, 16, 48]] = 99      # a tie across the boundary of parts 0 and 1
  return x


def test_argmax_as_a_merge_equals_numpy(partitioner, mesh2x4):
  x = ties()
  xs = put(x, mesh2x4, P("a", "b"))
  f = jax.jit(user_argmax)
  value, index = f(xs)
  np.testing.assert_array_equal(np.asarray(index), np.argmax(x, -1))
  np.testing.assert_array_equal(np.asarray(value), x.max(-1))
  text = f.lower(xs).compile().as_text()
  assert local_shapes(the_custom_call(text, ARG)) == [(2, 16)]
  assert {c.opcode for c in _hlo.collectives(text)} == {"all-gather"}


def test_the_parts_merge_in_order_along_the_dim(partitioner, mesh2x4):
  """A non-commutative merge (the last part's tie wins; the kernel gives the
  first index within its part) sees the parts in order, whatever order the
  mesh axes put the devices in."""
  x = ties(seed=1)
  xs = put(x, mesh2x4, P(None, ("b", "a")))
  _, index = jax.jit(lambda x: user_argmax(x, bp.Combiner(last_max, index_results=(1,))))(xs)
  parts = x.reshape(4, 8, 8)
  last_part = 7 - np.argmax(parts.max(-1)[:, ::-1], -1)
  within = np.argmax(parts[np.arange(4), last_part], -1)
  np.testing.assert_array_equal(np.asarray(index), last_part * 8 + within)


def welford(a, b):
  (na, ma, m2a), (nb, mb, m2b) = a, b
  n = na + nb
  d = mb - ma
  return n, ma + d * nb / n, m2a + m2b + d * d * na * nb / n


def _np_moments(x):
  return (np.full(x.shape[:-1], x.shape[-1], x.dtype), x.mean(-1),
          ((x - x.mean(-1, keepdims=True)) ** 2).sum(-1))


def test_welford_moments_through_pure_callback(partitioner, mesh2x4):
  x = np.random.default_rng(2).standard_normal((4, 64)) * 3 + 10
  xs = put(x, mesh2x4, P("a", "b"))
  out_type = jax.ShapeDtypeStruct((4,), np.float64)
  f = jax.jit(lambda x: bp.pure_callback(_np_moments, (out_type,) * 3, x,
                                         signature="(n)->(),(),()",
                                         reduce={"n": bp.Combiner(welford)}))
  count, mean, m2 = f(xs)
  np.testing.assert_array_equal(np.asarray(count), 64)
  np.testing.assert_allclose(np.asarray(mean), x.mean(-1), rtol=1e-12)
  np.testing.assert_allclose(np.asarray(m2) / 64, x.var(-1), rtol=1e-10)


def lse_merge(a, b):
  (oa, la), (ob, lb) = a, b
  m = jnp.maximum(la, lb)
  safe = jnp.where(jnp.isfinite(m), m, 0)
  wa, wb = jnp.exp(la - safe), jnp.exp(lb - safe)
  z = wa + wb
  summed = wa[:, None] * jnp.nan_to_num(oa) + wb[:, None] * jnp.nan_to_num(ob)
  o = jnp.where(z[:, None] > 0, summed / jnp.where(z > 0, z, 1)[:, None], 0)
  return o, safe + jnp.log(z)


def test_attention_merged_by_a_user_combiner(partitioner, mesh2x4):
  rng = np.random.default_rng(3)
  q, k = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 32, 4))
  v, bias = rng.standard_normal((2, 32, 5)), np.zeros((2, 32))
  bias[0, 8:16] = -np.inf
  out = (jax.ShapeDtypeStruct((2, 3, 5), np.float64), jax.ShapeDtypeStruct((2, 3), np.float64))
  call = bp.ffi_call("batchpart_test_attention", out,
                     signature="(q,d),(n,d),(n,e),(n)->(q,e),(q)",
                     reduce={"n": bp.Combiner(lse_merge)})
  args = [put(q, mesh2x4, P("a")), *(put(a, mesh2x4, P("a", "b")) for a in (k, v, bias))]
  o, lse = jax.jit(call)(*args)
  o_ref, lse_ref = kernels.attention_reference(q, k, v, bias)
  np.testing.assert_allclose(np.asarray(o), o_ref, rtol=1e-12, atol=1e-12)
  np.testing.assert_allclose(np.asarray(lse), lse_ref, rtol=1e-12)


def corners(x):
  """Per (j, batch element): the first and the last element of x's (n, m)
  block in row-major order, x laid out as (j, n, batch, m)."""
  return x[:, 0, ..., 0], x[:, -1, ..., -1]


# Associative and not commutative; it merges the parts along n, or along m,
# on its own, so folding the grid of parts n-major gives the whole block's.
CORNERS = bp.Combiner(lambda a, b: (a[0], b[1]))


def test_a_combiner_over_two_dims_with_core_dims_before_the_batch(partitioner):
  """The grid of parts (4 along n, 2 along m) folds in order, the first
  declared dim major, on a mesh whose devices run backwards (so device order
  is not part order); the results have a core dim before their batch dims."""
  mesh = Mesh(np.array(jax.devices()[::-1]).reshape(2, 4), ("a", "b"),
              axis_types=(AxisType.Auto,) * 2)
  x = np.random.default_rng(5).standard_normal((3, 16, 4, 6))
  out = (jax.ShapeDtypeStruct((3, 4), np.float64),) * 2
  call = lambda x: bp.pure_callback(corners, out, x, signature="(j,n,...,m)->(j,...),(j,...)",
                                    reduce={"n": CORNERS, "m": CORNERS})
  f = jax.jit(call)
  xs = put(x, mesh, P(None, "b", None, "a"))
  first, last = f(xs)
  np.testing.assert_array_equal(np.asarray(first), x[:, 0, :, 0])
  np.testing.assert_array_equal(np.asarray(last), x[:, -1, :, -1])
  text = f.lower(xs).compile().as_text()
  kernel = the_custom_call(text, "xla_ffi_python_cpu_callback")
  # The callback's operand, batch dims first: x's part of n and m, never gathered.
  assert local_shapes(kernel)[1] == (4, 3, 4, 3)
  assert {c.opcode for c in _hlo.collectives(text)} == {"all-gather"}
  # vmap adds a batch dim at the '...', which the merge is mapped over too.
  stacked = np.stack([x, -x])
  first, last = jax.jit(jax.vmap(call))(put(stacked, mesh, P(None, None, "b", None, "a")))
  np.testing.assert_array_equal(np.asarray(first), stacked[:, :, 0, :, 0])
  np.testing.assert_array_equal(np.asarray(last), stacked[:, :, -1, :, -1])


SUM_MAX = bp.Combiner(lambda a, b: (a[0] + b[0], jnp.maximum(a[1], b[1])))


@pytest.mark.parametrize("dims", ["n", "nm"])
def test_the_layout_kernel_with_core_dims_before_the_batch(partitioner, mesh2x4, dims):
  """``batchpart_test_layout`` with x laid out (j, n, batch[, m]), the
  combining results (j, batch) and a result that keeps the reduced dims:
  against NumPy, each device's kernel on its part of x, one all-gather of
  result-sized parts."""
  roles = "jn0" + dims[1:]
  results = ["j0", roles, "j0"]
  sizes = {"0": 4, "j": 3, "n": 8, "m": 2}
  x = np.random.default_rng(6).integers(-4, 5, [sizes[r] for r in roles]).astype(np.float32)
  call = layouts.ffi_call("sum_max", [roles], results, sizes,
                          reduce={d: SUM_MAX for d in dims})
  f = jax.jit(call)
  xs = put(x, mesh2x4, P(None, "b", "a", None) if dims == "nm" else P(None, "b", "a"))
  got = f(xs)
  for g, w in zip(got, layouts.compute("sum_max", [roles], results, x)):
    np.testing.assert_array_equal(np.asarray(g), w)
  text = f.lower(xs).compile().as_text()
  assert local_shapes(the_custom_call(text, layouts.TARGET))[0][:3] == (3, 2, 2)
  gathers = [c for c in _hlo.collectives(text)]
  assert {c.opcode for c in gathers} == {"all-gather"}
  assert all(math.prod(t.shape) <= 4 * 3 * 4 for c in gathers for t in c.result_types)


@pytest.mark.timeout(600)
@helpers.property_settings(15)
@given(data=st.data())
def test_drawn_meshes_shardings_sizes_and_merges(partitioner, data):
  mesh = helpers.draw_mesh(data)
  B = data.draw(st.sampled_from([1, 2, 4]), label="B")
  n = data.draw(st.sampled_from([4, 8, 10, 16]), label="n")
  smallest = data.draw(st.booleans(), label="argmin (else argmax)")
  spec = helpers.random_spec(data, mesh, 2, "x", shuffle=True)
  rng = np.random.default_rng(data.draw(st.integers(0, 2**16), label="seed"))
  x = rng.integers(-2, 2, (B, n)).astype(np.float32)
  sign = -1 if smallest else 1
  # argmin as the argmax of -x, merged by first_max.
  f, args = helpers.constrained_call(mesh, [spec], lambda x: user_argmax(sign * x), x)
  value, index = f(*args)
  np.testing.assert_array_equal(np.asarray(index), np.argmax(sign * x, -1))
  np.testing.assert_array_equal(np.asarray(value), (sign * x).max(-1))


def test_export_vmap_explain_and_explicit(partitioner, mesh2x4, explicit_mesh2x4):
  """An exported program carries the merge's digest in its derived name;
  vmap adds a batch dim the merge is mapped over; bp.explain names the merge
  and its all-gather; Explicit mode types the combined results unsharded
  over the dim."""
  from jax import export
  x = ties(batch=4, seed=4)
  xs = put(x, mesh2x4, P("a", "b"))
  exported = export.export(jax.jit(user_argmax), disabled_checks=[
      export.DisabledSafetyCheck.custom_call(ARG)])(xs)
  assert "$x:n=merge_" in exported.mlir_module()

  stacked = put(x.reshape(2, 2, 64), mesh2x4, P(None, "a", "b"))
  _, index = jax.jit(jax.vmap(user_argmax))(stacked)
  np.testing.assert_array_equal(np.asarray(index).reshape(-1), np.argmax(x, -1))

  report = bp.explain(user_argmax, xs)
  assert "one per device of each all-gather group, merged by an all-gather of each part's" \
      in flat(str(report))
  assert [(c.kind, c.declared_reduction) for c in report.calls[0].collectives_after] == [
      ("all-gather", True)]

  mesh = explicit_mesh2x4
  with jax.set_mesh(mesh):
    value, index = jax.jit(user_argmax)(put(x, mesh, P("a", "b")))
    assert jax.typeof(index).sharding.spec == P("a")
  np.testing.assert_array_equal(np.asarray(index), np.argmax(x, -1))
