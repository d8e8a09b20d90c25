"""Reduced core dims on 8 devices: ``reduce={"n": op}``, under Shardy and GSPMD.

``batchpart_test_reduce_rows`` computes op over n of ``w[n] * x[n, k]``
(op sum, max or min). With n declared reduced, a device that holds part of n
runs the kernel on that part and one all-reduce over exactly the devices
holding the other parts combines the results. The tests read the compiled
program (per-device operand shapes of the call, the all-reduce and its
replica groups, the absence of gathers) and compare every result with the
unsharded NumPy reference: a wrong group sums parts twice or misses some, a
wrong combiner or a reduction over padding gives wrong values, and a
gathered n silently loses the parallelism. The kernel counts batch x n rows,
so duplicated work shows too.

Covered: every op and dtype; the 2x4 case (batch on one axis, n on the
other); n over both axes; n sharded with the batch replicated; replicated
weights cut like x; n unsharded (no all-reduce); uneven n (not kept);
Explicit mode (result types as ``jnp.sum`` gives); fully and partially
manual ``shard_map``; vmap; a reduced dim in front of the batch dims, an
operand without batch dims, two reduced dims (``batchpart_test_core_sum``);
an adopted target whose per-shard attribute rule reads the local n;
jax.export; and a property test over drawn meshes, shardings, sizes and ops.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from jax import export
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import batchpart as bp
from batchpart import _hlo, testing as kernels

from helpers import (
  auto_mesh,
  collective_kinds,
  divides,
  local_shapes,
  put,
  random_spec,
  replica_groups,
  the_custom_call,
)

TARGET = "batchpart_test_reduce_rows"
SIG = "(n,k),(n)->(k)"
OPS = ["sum", "max", "min"]
S = jax.ShapeDtypeStruct


# ---- helpers -------------------------------------------------------------------------

def operands(seed, batch, n, k, dtype=np.float32):
  """``reduce_rows`` operands drawn with ``seed``."""
  return kernels.reduce_rows_operands(np.random.default_rng(seed), batch, n, k, dtype)


def assert_close(actual, expected):
  actual = np.asarray(actual)
  expected = np.asarray(expected).astype(actual.dtype)
  assert actual.shape == expected.shape, (actual.shape, expected.shape)
  if actual.dtype.kind == "i":
    np.testing.assert_array_equal(actual, expected)
  else:
    tol = 1e-4 if actual.dtype in (np.float32, np.complex64) else 1e-11
    scale = max(1.0, float(np.max(np.abs(expected), initial=0.0)))
    np.testing.assert_allclose(actual, expected, rtol=tol, atol=tol * scale)


def reduce_rows(op):
  return lambda x, w: kernels.reduce_rows(x, w, op)


def compile_and_run(f, *args):
  """One compile: the compiled text, the results and the rows the kernel
  processed."""
  compiled = jax.jit(f).lower(*args).compile()
  kernels.reset_batch_elements_processed()
  out = jax.block_until_ready(compiled(*args))
  return compiled.as_text(), out, kernels.batch_elements_processed()


def all_reduces(text):
  return [c for c in _hlo.collectives(text) if c.opcode == "all-reduce"]


def call_all_reduces(text):
  """The all-reduces of the call's result (XLA may add others of its own,
  e.g. to replicate a padded result)."""
  call = the_custom_call(text, TARGET)
  return [c for c in all_reduces(text) if call.name in c.operand_names]


def expected_groups(mesh, axes) -> set[frozenset[int]]:
  """The logical devices that differ only in the coordinates of ``axes``
  (the devices holding the parts of one batch block)."""
  names = list(mesh.axis_names)
  ids = np.arange(mesh.size).reshape(mesh.devices.shape)
  chosen = [names.index(a) for a in axes]
  rest = [i for i in range(len(names)) if i not in chosen]
  size = math.prod(mesh.devices.shape[i] for i in chosen)
  return {frozenset(int(i) for i in g) for g in ids.transpose(rest + chosen).reshape(-1, size)}


def assert_one_all_reduce(text, mesh, axes):
  """Exactly one all-reduce, over the devices that differ only in ``axes``,
  and nothing gathered or exchanged."""
  (reduce,) = all_reduces(text)
  assert replica_groups(reduce) == expected_groups(mesh, axes), reduce.text
  assert not collective_kinds(text) & {"all-gather", "all-to-all"}


def _axes(entry) -> tuple[str, ...]:
  """The mesh axes of one PartitionSpec entry."""
  return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


def spec_of(array, rank):
  """An array's PartitionSpec padded with None to ``rank`` entries."""
  spec = tuple(array.sharding.spec)
  return P(*spec, *([None] * (rank - len(spec))))


def test_replica_group_forms_read_alike():
  lines = ["a = f32[2] all-reduce(b), replica_groups={{0,1,2,3},{4,5,6,7}}, to_apply=r",
           "a = f32[2] all-reduce(b), replica_groups=[2,4]<=[8], to_apply=r",
           "a = f32[2] all-reduce(b), replica_groups=mesh['p'=2,'q'=4] {'q'}, to_apply=r",
           "a = f32[2] all-reduce(b), replica_groups=mesh['q'=4,'p'=2], "
           "device_ids=([2,4]T(1,0)) {'p'}, to_apply=r"]
  want = {frozenset(range(4)), frozenset(range(4, 8))}
  for line in lines[:3]:
    assert replica_groups(_hlo.instructions(line)[0]) == want, line
  # Devices 0,4,1,5,... on a (q, p) mesh; groups over p pair i with i + 4.
  assert replica_groups(_hlo.instructions(lines[3])[0]) == {
      frozenset({i, i + 4}) for i in range(4)}
  assert replica_groups(_hlo.instructions(
      "a = f32[2] all-reduce(b), replica_groups=[4,2]<=[2,4]T(1,0), to_apply=r")[0]) == {
          frozenset({i, i + 4}) for i in range(4)}


# ---- values and the compiled program ------------------------------------------------------

@pytest.mark.timeout(300)
@pytest.mark.parametrize("op, dtype", [
    (op, dtype) for op in OPS
    for dtype in (np.float32, np.float64, np.int32, np.int64, np.complex64, np.complex128)
    if op == "sum" or np.dtype(dtype).kind != "c"
], ids=lambda v: v if isinstance(v, str) else np.dtype(v).name)
def test_every_op_and_dtype(partitioner, mesh2x4, op, dtype):
  with jax.enable_x64(True):
    x, w = operands(1, (4,), 32, 3, dtype)
    text, out, _ = compile_and_run(reduce_rows(op), put(x, mesh2x4, P("a", "b")),
                                   put(w, mesh2x4, P("a", "b")))
    assert out.dtype == np.dtype(dtype)
    assert_close(out, kernels.reduce_rows_reference(x, w, op))
    assert_one_all_reduce(text, mesh2x4, ["b"])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("op", OPS)
def test_batch_on_one_axis_and_n_on_the_other(partitioner, mesh2x4, op):
  """The 2x4 case: batch on 'a', n on 'b'. Each device runs (B/2, n/4)
  and one all-reduce per row of the mesh combines the four parts."""
  B, n, k = 8, 64, 5
  x, w = operands(2, (B,), n, k)
  args = put(x, mesh2x4, P("a", "b")), put(w, mesh2x4, P("a", "b"))
  text, out, rows = compile_and_run(reduce_rows(op), *args)
  assert local_shapes(the_custom_call(text, TARGET)) == [(B // 2, n // 4, k), (B // 2, n // 4)]
  (reduce,) = all_reduces(text)
  assert replica_groups(reduce) == {frozenset({0, 1, 2, 3}), frozenset({4, 5, 6, 7})}
  assert collective_kinds(text) == {"all-reduce"}
  assert spec_of(out, 2) == P("a", None)
  assert rows == B * n
  assert_close(out, kernels.reduce_rows_reference(x, w, op))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("axes", [("a", "b"), ("b", "a")])
def test_n_over_both_axes(partitioner, mesh2x4, axes):
  B, n, k = 4, 64, 3
  x, w = operands(3, (B,), n, k)
  args = put(x, mesh2x4, P(None, axes)), put(w, mesh2x4, P(None, axes))
  text, out, rows = compile_and_run(reduce_rows("sum"), *args)
  assert local_shapes(the_custom_call(text, TARGET)) == [(B, n // 8, k), (B, n // 8)]
  assert_one_all_reduce(text, mesh2x4, ["a", "b"])
  assert spec_of(out, 2) == P(None, None)
  assert rows == B * n
  assert_close(out, kernels.reduce_rows_reference(x, w, "sum"))


@pytest.mark.timeout(120)
def test_n_sharded_batch_replicated(partitioner, mesh8, mesh2x4):
  B, n, k = 4, 32, 3
  x, w = operands(4, (B,), n, k)
  for mesh, axis in ((mesh8, "x"), (mesh2x4, "b")):
    args = put(x, mesh, P(None, axis)), put(w, mesh, P(None, axis))
    text, out, rows = compile_and_run(reduce_rows("max"), *args)
    parts = mesh.shape[axis]
    assert local_shapes(the_custom_call(text, TARGET)) == [(B, n // parts, k), (B, n // parts)]
    assert_one_all_reduce(text, mesh, [axis])
    # Devices not on n hold the same batch: they repeat the work, as for
    # any replicated batch.
    assert rows == B * n * (mesh.size // parts)
    assert_close(out, kernels.reduce_rows_reference(x, w, "max"))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("w_spec", [P(), P("a"), P(None, "b")])
def test_weights_are_cut_like_x(partitioner, mesh2x4, w_spec):
  """w arrives replicated (or sharded otherwise) while x is n-sharded: w is
  cut to x's parts, and x is never gathered."""
  B, n, k = 4, 64, 3
  x, w = operands(5, (B,), n, k)
  args = put(x, mesh2x4, P("a", "b")), put(w, mesh2x4, w_spec)
  text, out, rows = compile_and_run(reduce_rows("min"), *args)
  assert local_shapes(the_custom_call(text, TARGET)) == [(B // 2, n // 4, k), (B // 2, n // 4)]
  assert_one_all_reduce(text, mesh2x4, ["b"])
  assert rows == B * n
  assert_close(out, kernels.reduce_rows_reference(x, w, "min"))


@pytest.mark.timeout(120)
def test_unsharded_n_adds_nothing(partitioner, mesh2x4):
  """n whole on every device: the program is the one without reduce=."""
  B, n, k = 8, 16, 3
  x, w = operands(6, (B,), n, k)
  args = put(x, mesh2x4, P(("a", "b"))), put(w, mesh2x4, P(("a", "b")))
  text, out, rows = compile_and_run(reduce_rows("sum"), *args)
  plain, _, _ = compile_and_run(lambda x, w: kernels.reduce_rows(x, w, reduce=False), *args)
  assert local_shapes(the_custom_call(text, TARGET)) == [(1, n, k), (1, n)]
  assert collective_kinds(text) == collective_kinds(plain) == set()
  assert rows == B * n
  assert_close(out, kernels.reduce_rows_reference(x, w, "sum"))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("B, n, spec", [
    (4, 10, P(None, "b")),          # n = 10 on 4 devices
    (4, 10, P("a", "b")),
    (8, 12, P(None, ("a", "b"))),   # n = 12 on 8 devices
    (3, 6, P("a", "b")),            # uneven batch too
])
@pytest.mark.parametrize("op", ["sum", "max"])
def test_uneven_n_is_not_kept(partitioner, mesh2x4, B, n, spec, op):
  """Padding would enter a kept split of n: n is re-batched or gathered
  instead, with the right values and no all-reduce."""
  x, w = operands(7, (B,), n, 3)
  sharding = NamedSharding(mesh2x4, spec)

  def f(x, w):
    x = jax.lax.with_sharding_constraint(x, sharding)
    w = jax.lax.with_sharding_constraint(w, NamedSharding(mesh2x4, P(*spec[:2])))
    return kernels.reduce_rows(x, w, op)

  text, out, _ = compile_and_run(f, put(x, mesh2x4, P()), put(w, mesh2x4, P()))
  assert local_shapes(the_custom_call(text, TARGET))[0][1] == n
  assert not all_reduces(text)
  assert_close(out, kernels.reduce_rows_reference(x, w, op))


# ---- Explicit mode ----------------------------------------------------------------------

@pytest.mark.timeout(120)
@pytest.mark.parametrize("w_like_x", [True, False], ids=["w_like_x", "w_replicated"])
@pytest.mark.parametrize("spec", [P("a", "b"), P(None, "b"), P(None, ("a", "b")), P("b", "a"),
                                  P("a"), P(("a", "b"))])
def test_explicit_mode_types_results_as_jnp_sum(partitioner, spec, w_like_x):
  """The result type is replicated over the reduced axes and keeps the
  batch axes, as jnp.sum over a sharded dim is typed."""
  mesh = jax.make_mesh((2, 4), ("a", "b"), axis_types=(AxisType.Explicit,) * 2)
  B, n, k = 8, 32, 3
  x, w = operands(8, (B,), n, k)
  with jax.set_mesh(mesh):
    xs = jax.device_put(x, NamedSharding(mesh, spec))
    ws = jax.device_put(w, NamedSharding(mesh, P(*spec[:2]) if w_like_x else P()))
    f = jax.jit(reduce_rows("sum"))
    want_type = jax.typeof(jax.jit(lambda x, w: jnp.sum(w[..., None] * x, axis=-2))(xs, ws))
    assert jax.typeof(jax.eval_shape(f, xs, ws)).sharding.spec == want_type.sharding.spec
    text = f.lower(xs, ws).compile().as_text()
    out = f(xs, ws)
  assert jax.typeof(out).sharding.spec == want_type.sharding.spec
  assert out.sharding.spec == want_type.sharding.spec
  assert "all-gather" not in collective_kinds(text)
  n_axes = _axes(spec[1]) if len(spec) > 1 else ()
  if n_axes:
    assert_one_all_reduce(text, mesh, n_axes)
  else:
    assert not all_reduces(text)
  assert_close(out, kernels.reduce_rows_reference(x, w, "sum"))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("spec", [P("a", None, "b"), P(None, "a", "b"), P(None, None, ("a", "b")),
                                  P("a", "b", None)])
def test_explicit_mode_under_vmap(partitioner, spec):
  mesh = jax.make_mesh((2, 4), ("a", "b"), axis_types=(AxisType.Explicit,) * 2)
  x, w = operands(17, (2, 4), 32, 3)
  with jax.set_mesh(mesh):
    xs, ws = (jax.device_put(a, NamedSharding(mesh, spec)) for a in (x, w))
    f = jax.jit(jax.vmap(reduce_rows("min")))
    want = jax.typeof(jax.jit(lambda x, w: jnp.min(w[..., None] * x, axis=-2))(xs, ws))
    text = f.lower(xs, ws).compile().as_text()
    out = f(xs, ws)
  assert jax.typeof(out).sharding.spec == out.sharding.spec == want.sharding.spec
  if spec[2] is None:
    assert not _hlo.collectives(text)
  else:
    assert_one_all_reduce(text, mesh, _axes(spec[2]))
  assert_close(out, kernels.reduce_rows_reference(x, w, "min"))


# ---- shard_map -----------------------------------------------------------------------

@pytest.mark.timeout(120)
def test_inside_shard_map_the_kernel_sees_its_part_and_the_user_combines(partitioner,
                                                                          mesh2x4):
  B, n, k = 4, 64, 3
  x, w = operands(9, (B,), n, k)
  args = put(x, mesh2x4, P("a", "b")), put(w, mesh2x4, P("a", "b"))

  def parts(x, w):
    return kernels.reduce_rows(x, w, "sum")

  def combined(x, w):
    return jax.lax.psum(kernels.reduce_rows(x, w, "sum"), "b")

  specs = dict(mesh=mesh2x4, in_specs=(P("a", "b"), P("a", "b")))
  text, out, rows = compile_and_run(jax.shard_map(parts, out_specs=P("a", "b"), **specs), *args)
  assert local_shapes(the_custom_call(text, TARGET)) == [(B // 2, n // 4, k), (B // 2, n // 4)]
  assert not _hlo.collectives(text)
  assert rows == B * n
  # Device (i, j) holds rows i of the batch and part j of n: its result is the
  # NumPy reduction over that part alone.
  for j in range(4):
    part = slice(j * n // 4, (j + 1) * n // 4)
    assert_close(np.asarray(out)[:, j * k:(j + 1) * k],
                 kernels.reduce_rows_reference(x[:, part], w[:, part], "sum"))
  text, out, _ = compile_and_run(jax.shard_map(combined, out_specs=P("a"), **specs), *args)
  assert len(all_reduces(text)) == 1          # the user's psum, no other
  assert_close(out, kernels.reduce_rows_reference(x, w, "sum"))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("constrain", [False, True], ids=["propagated", "constrained"])
def test_inside_partially_manual_shard_map_n_is_not_kept(partitioner, mesh2x4, constrain):
  """Manual over 'a', n on the free axis 'b' (propagated from the input, or
  constrained inside): XLA gives the partitioner the free axes' shardings
  numbered within one manual subgroup, so no all-reduce over the whole
  program could be written there. n is handled as any core dim: the values
  are right and the call's result is never all-reduced."""
  B, n, k = 4, 64, 3
  x, w = operands(10, (B,), n, k)

  def body(x, w):
    if constrain:
      x = jax.lax.with_sharding_constraint(x, P(None, "b"))
      w = jax.lax.with_sharding_constraint(w, P(None, "b"))
    return kernels.reduce_rows(x, w, "sum")

  f = jax.shard_map(body, mesh=mesh2x4, in_specs=(P("a"), P("a")), out_specs=P("a"),
                    axis_names={"a"})
  args = put(x, mesh2x4, P("a", "b")), put(w, mesh2x4, P("a", "b"))
  text, out, _ = compile_and_run(f, *args)
  assert local_shapes(the_custom_call(text, TARGET))[0][1] == n
  assert not call_all_reduces(text)
  assert_close(out, kernels.reduce_rows_reference(x, w, "sum"))


# ---- vmap ----------------------------------------------------------------------------

@pytest.mark.timeout(120)
@pytest.mark.parametrize("spec", [P(None, "a", "b"), P("a", None, "b"), P("a", "b", None),
                                  P(None, None, ("a", "b"))])
def test_vmap_keeps_n_reduced(partitioner, mesh2x4, spec):
  V, B, n, k = 2, 4, 32, 3
  x, w = operands(11, (V, B), n, k)
  args = put(x, mesh2x4, spec), put(w, mesh2x4, spec)
  f = jax.vmap(reduce_rows("max"))
  text, out, rows = compile_and_run(f, *args)
  tiles = [math.prod(mesh2x4.shape[a] for a in _axes(e)) for e in spec]
  local = [V // tiles[0], B // tiles[1], n // tiles[2]]
  assert local_shapes(the_custom_call(text, TARGET)) == [(*local, k), tuple(local)]
  if spec[2] is None:
    assert not _hlo.collectives(text)
  else:
    assert_one_all_reduce(text, mesh2x4, _axes(spec[2]))
  assert rows == V * B * n
  assert_close(out, kernels.reduce_rows_reference(x, w, "max"))


# ---- reduced dims before the batch dims, broadcast operands, two reduced dims -------------
#
# batchpart_test_core_sum sums every core element of both operands at each
# batch element, wherever the core dims are: a sum over any of them combines
# over any split of it, so its leading dims may be declared reduced.

CORE_SUM = "batchpart_test_core_sum"


def core_sum(signature, reduce, out_shape, **placement):
  attrs = {k: np.int64(v) for k, v in placement.items()}
  return lambda x, y: bp.ffi_call(CORE_SUM, S(out_shape, x.dtype), signature=signature,
                                  reduce=reduce)(x, y, **attrs)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("x_spec, y_spec, local_n, n_axes", [
    (P("b", "a"), P("b", "a"), 4, ["b"]),
    (P(("a", "b")), P(("a", "b")), 2, ["a", "b"]),
    (P("b"), P(), 4, ["b"]),
])
def test_reduced_dim_before_the_batch_dims(partitioner, mesh2x4, x_spec, y_spec, local_n,
                                           n_axes):
  """Signature "(n,...,t),(n,...)->(...)": n leads, in front of the batch
  dims."""
  n, B, t = 16, 8, 3
  rng = np.random.default_rng(14)
  x = rng.standard_normal((n, B, t)).astype(np.float32)
  y = rng.standard_normal((n, B)).astype(np.float32)
  f = core_sum("(n,...,t),(n,...)->(...)", {"n": "sum"}, (B,), x_lead=1, x_trail=1, y_lead=1,
               y_trail=0, out_lead=0, out_trail=0)
  text, out, _ = compile_and_run(f, put(x, mesh2x4, x_spec), put(y, mesh2x4, y_spec))
  batch = B // (2 if x_spec == P("b", "a") else 1)
  assert local_shapes(the_custom_call(text, CORE_SUM)) == [(local_n, batch, t), (local_n, batch)]
  assert_one_all_reduce(text, mesh2x4, n_axes)
  assert_close(out, x.sum(axis=(0, 2)) + y.sum(axis=0))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("x_spec", [P("b", "a"), P(("a", "b"))])
def test_broadcast_operand_is_cut_along_n(partitioner, mesh2x4, x_spec):
  """y has n and no batch dims: it is cut into x's parts of n, not
  broadcast whole."""
  n, B, t = 16, 8, 3
  rng = np.random.default_rng(15)
  x = rng.standard_normal((n, B, t)).astype(np.float32)
  y = rng.standard_normal((n,)).astype(np.float32)
  f = core_sum("(n,...,t),(n,...)->(...)", {"n": "sum"}, (B,), x_lead=1, x_trail=1, y_lead=1,
               y_trail=0, out_lead=0, out_trail=0)
  text, out, _ = compile_and_run(f, put(x, mesh2x4, x_spec), put(y, mesh2x4, P()))
  n_axes = list(_axes(x_spec[0]))
  parts = math.prod(mesh2x4.shape[a] for a in n_axes)
  assert local_shapes(the_custom_call(text, CORE_SUM))[1] == (n // parts,)
  assert_one_all_reduce(text, mesh2x4, n_axes)
  assert_close(out, x.sum(axis=(0, 2)) + y.sum())


@pytest.mark.timeout(120)
@pytest.mark.parametrize("x_spec, y_spec, local", [
    (P("a", None, "b"), P("a", None, "b"), (4, 4, 2)),      # n on a, m on b
    (P("b", "a", None), P("b", "a"), (2, 2, 8)),            # n on b, batch on a
    (P(None, None, ("a", "b")), P(), (8, 4, 1)),            # m on both
])
def test_two_reduced_dims_combine_in_one_all_reduce(partitioner, mesh2x4, x_spec, y_spec,
                                                    local):
  n, B, m = 8, 4, 8
  rng = np.random.default_rng(16)
  x = rng.standard_normal((n, B, m)).astype(np.float32)
  y = rng.standard_normal((n, B, m)).astype(np.float32)
  f = core_sum("(n,...,m),(n,...,m)->(...)", {"n": "sum", "m": "sum"}, (B,), x_lead=1,
               x_trail=1, y_lead=1, y_trail=1, out_lead=0, out_trail=0)
  text, out, _ = compile_and_run(f, put(x, mesh2x4, x_spec), put(y, mesh2x4, y_spec))
  assert local_shapes(the_custom_call(text, CORE_SUM)) == [local, local]
  reduced_axes = list(_axes(x_spec[0])) + list(_axes(x_spec[2] if len(x_spec) > 2 else None))
  assert_one_all_reduce(text, mesh2x4, reduced_axes)
  assert_close(out, x.sum(axis=(0, 2)) + y.sum(axis=(0, 2)))


# ---- an adopted target with a per-shard attribute rule ------------------------------------

@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [64, 10])
def test_adopted_target_gets_its_local_n(partitioner, mesh2x4, n):
  """The kernel checks its ``rows`` attribute against the n it sees; a rule
  reading the local n from core_sizes restates it per device (the whole n
  where an uneven n is not kept)."""
  B, k = 4, 3
  x, w = operands(12, (B,), n, k)

  def package(x, w):
    return jax.ffi.ffi_call(TARGET, S((x.shape[0], x.shape[-1]), x.dtype))(
        x, w, op=np.int64(kernels.REDUCE_OPS["sum"]), rows=np.int64(x.shape[1]))

  bp.partition_ffi_target(TARGET, signature=SIG, reduce={"n": "sum"},
                          shard_attributes=lambda attrs, batch, core: {
                              "rows": np.int64(core["n"])})
  try:
    sharding = NamedSharding(mesh2x4, P("a", "b"))

    def f(x, w):
      return package(jax.lax.with_sharding_constraint(x, sharding),
                     jax.lax.with_sharding_constraint(w, sharding))

    text, out, rows = compile_and_run(f, put(x, mesh2x4, P()), put(w, mesh2x4, P()))
    local_n = local_shapes(the_custom_call(text, TARGET))[1][1]
    if n % 4 == 0:
      assert local_n == n // 4
      assert_one_all_reduce(text, mesh2x4, ["b"])
      assert rows == B * n
    else:
      assert local_n == n and not all_reduces(text)
    assert_close(out, kernels.reduce_rows_reference(x, w, "sum"))
  finally:
    bp.unpartition(TARGET)


# ---- jax.export ----------------------------------------------------------------------

@pytest.mark.timeout(120)
@pytest.mark.parametrize("sharded_export", [True, False], ids=["sharded", "one_device"])
def test_export_round_trip(partitioner, mesh2x4, sharded_export):
  """Exported under each partitioner (sharded, or on one device), called
  sharded. jax 0.10 cannot call a GSPMD artifact under GSPMD, so every
  artifact is called under Shardy: a GSPMD one gets its Shardy rule, with
  the reduction factor, when it is called."""
  B, n, k = 4, 64, 3
  x, w = operands(13, (B,), n, k)
  sharding = NamedSharding(mesh2x4, P("a", "b"))
  if sharded_export:
    jitted = jax.jit(reduce_rows("min"), in_shardings=(sharding, sharding))
    avals = [S(a.shape, a.dtype, sharding=sharding) for a in (x, w)]
  else:
    jitted = jax.jit(reduce_rows("min"))
    avals = [S(a.shape, a.dtype) for a in (x, w)]
  exported = export.export(jitted, disabled_checks=[
      export.DisabledSafetyCheck.custom_call(TARGET)])(*avals)
  assert "$x:n=min:0.-2,1.-1" in exported.mlir_module()
  restored = export.deserialize(exported.serialize())
  previous = jax.config.jax_use_shardy_partitioner
  jax.config.update("jax_use_shardy_partitioner", True)
  try:
    args = put(x, mesh2x4, P("a", "b")), put(w, mesh2x4, P("a", "b"))
    text, out, rows = compile_and_run(restored.call, *args)
  finally:
    jax.config.update("jax_use_shardy_partitioner", previous)
  assert local_shapes(the_custom_call(text, TARGET)) == [(2, 16, k), (2, 16)]
  assert_one_all_reduce(text, mesh2x4, ["b"])
  assert rows == B * n
  assert_close(out, kernels.reduce_rows_reference(x, w, "min"))


# ---- property test ---------------------------------------------------------------------

MESHES = [(8,), (2, 4), (4, 2), (2, 2, 2)]
BATCH_SIZES = [1, 2, 3, 4, 6, 8, 16]
N_SIZES = [1, 2, 3, 4, 5, 8, 10, 12, 16, 32]
@pytest.mark.timeout(600)
@settings(max_examples=40, deadline=None, database=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_drawn_meshes_shardings_and_sizes(partitioner, data):
  """Values always match NumPy. Where x's n splits evenly over its axes and w
  is cut like x (or replicated), exactly one all-reduce over x's n axes
  combines the parts and, where the batch splits evenly too, each row is
  computed once per device that replicates it; where n is whole or split
  unevenly, there is no all-reduce."""
  mesh = auto_mesh(data.draw(st.sampled_from(MESHES), label="mesh"))
  B = data.draw(st.sampled_from(BATCH_SIZES), label="B")
  n = data.draw(st.sampled_from(N_SIZES), label="n")
  k = data.draw(st.sampled_from([1, 3]), label="k")
  op = data.draw(st.sampled_from(OPS), label="op")
  dtype = data.draw(st.sampled_from([np.float32, np.int32]), label="dtype")
  x_spec = P(*random_spec(data, mesh, 2, "x", shuffle=True), None)
  w_mode = data.draw(st.sampled_from(["like x", "replicated", "drawn"]), label="w")
  if w_mode == "drawn":
    w_spec = random_spec(data, mesh, 2, "w", shuffle=True)
  else:
    w_spec = P(*x_spec[:2]) if w_mode == "like x" else P()
  x, w = operands(data.draw(st.integers(0, 2**16), label="seed"), (B,), n, k, dtype)

  def f(x, w):
    x = jax.lax.with_sharding_constraint(x, NamedSharding(mesh, x_spec))
    w = jax.lax.with_sharding_constraint(w, NamedSharding(mesh, w_spec))
    return kernels.reduce_rows(x, w, op)

  args = [put(a, mesh, s if divides(mesh, s, a.shape) else P())
          for a, s in ((x, x_spec), (w, w_spec))]
  text, out, rows = compile_and_run(f, *args)
  assert_close(out, kernels.reduce_rows_reference(x, w, op))

  batch_axes, n_axes = _axes(x_spec[0]), _axes(x_spec[1])
  n_parts = math.prod(mesh.shape[a] for a in n_axes)
  batch_parts = math.prod(mesh.shape[a] for a in batch_axes)
  reduces = call_all_reduces(text)
  if w_mode == "drawn":
    assert len(reduces) <= 1
  elif n_parts > 1 and n % n_parts == 0:
    (reduce,) = reduces
    assert replica_groups(reduce) == expected_groups(mesh, n_axes)
    assert local_shapes(the_custom_call(text, TARGET))[0][1] == n // n_parts
    if B % batch_parts == 0:
      assert collective_kinds(text) == {"all-reduce"} and len(all_reduces(text)) == 1
      assert rows == B * n * (mesh.size // (n_parts * batch_parts))
  else:
    assert not reduces


@pytest.mark.timeout(120)
def test_exported_reduced_call_inside_a_partially_manual_shard_map(mesh2x4):
  """An artifact exported sharded (its call names its reduction) and then
  called inside a shard_map manual over 'a' only: there no all-reduce can
  name the program's devices, so the call keeps n whole, as one lowered
  there would. Under Shardy only: jax 0.10 cannot lower a GSPMD artifact's
  call inside a partially manual shard_map, batchpart or not."""
  B, n, k = 4, 64, 3
  x, w = operands(14, (B,), n, k)
  body_export = export.export(jax.jit(reduce_rows("sum")), disabled_checks=[
      export.DisabledSafetyCheck.custom_call(TARGET)])(
          S((B // 2, n, k), x.dtype, sharding=NamedSharding(mesh2x4, P(None, "b"))),
          S((B // 2, n), w.dtype, sharding=NamedSharding(mesh2x4, P(None, "b"))))
  assert "$x:n=sum:0.-2,1.-1" in body_export.mlir_module()
  body = export.deserialize(body_export.serialize())
  f = jax.shard_map(body.call, mesh=mesh2x4, in_specs=(P("a"), P("a")), out_specs=P("a"),
                    axis_names={"a"})
  args = put(x, mesh2x4, P("a", "b")), put(w, mesh2x4, P("a", "b"))
  text, out, _ = compile_and_run(f, *args)
  assert not call_all_reduces(text)
  assert_close(out, kernels.reduce_rows_reference(x, w, "sum"))
