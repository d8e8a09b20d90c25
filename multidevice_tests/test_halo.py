"""Halo dims on 8 devices: ``halo={"n": bp.Halo(lo, hi, periodic)}``, under
Shardy and GSPMD.

``batchpart_test_stencil`` sums a window of ``lo + 1 + hi`` elements (per
dim, 1-D or 2-D) with asymmetric weights and a boundary rule (zero,
reflect, nearest, wrap); ``batchpart_test_laplacian`` is the 5-point
Laplacian. With the halo dim sharded, each device runs the kernel on its
window and keeps its part: the results must equal the unsharded call's bit
for bit, the compiled program must hold collective-permutes only (no
all-gather), and the kernel must see windows of ``lo + part + hi``
elements. Splits the window cannot take (uneven, or parts shorter than
``lo + hi``) keep the dim whole, still exact.
"""

import jax
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import batchpart as bp
from batchpart import testing as kernels

from helpers import collective_kinds, flat, local_shapes, put, rng, the_custom_call

STENCIL = "batchpart_test_stencil"
LAPLACIAN = "batchpart_test_laplacian"
S = jax.ShapeDtypeStruct
MODES = kernels.HALO_MODES


def attrs(lo, hi, mode, rank=1):
  return dict(rank=np.int64(rank), lo=np.int64(lo), hi=np.int64(hi),
              mode=np.int64(MODES[mode]))


def stencil(x, lo, hi, mode, rank=1, periodic=None):
  """The stencil declared with its halo (``periodic``: the wrap mode's)."""
  periodic = mode == "wrap" if periodic is None else periodic
  names = ("n",) if rank == 1 else ("n", "m")
  signature = f"({','.join(names)})->({','.join(names)})"
  return bp.ffi_call(STENCIL, S(x.shape, x.dtype), signature=signature,
                     halo={k: bp.Halo(lo, hi, periodic) for k in names})(
      x, **attrs(lo, hi, mode, rank))


def unsharded(x, lo, hi, mode, rank=1):
  x = np.asarray(x)
  return np.asarray(jax.ffi.ffi_call(STENCIL, S(x.shape, x.dtype))(
      x, **attrs(lo, hi, mode, rank)))


def constrained(f, mesh, spec):
  """``f`` on its argument constrained to ``spec`` inside the jit (uneven
  splits included, which device_put refuses)."""
  return jax.jit(lambda x: f(jax.lax.with_sharding_constraint(
      x, NamedSharding(mesh, spec))))


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("lo, hi", [(1, 1), (0, 3), (2, 1), (3, 0)])
def test_1d_stencil_equals_the_unsharded_call_bit_for_bit(partitioner, mesh8, mode, lo, hi):
  x = rng(1).standard_normal((3, 64)).astype(np.float32)
  f = jax.jit(lambda x: stencil(x, lo, hi, mode))
  xs = put(x, mesh8, P(None, "x"))
  out = f(xs)
  np.testing.assert_array_equal(np.asarray(out), unsharded(x, lo, hi, mode))
  assert out.sharding.spec == P(None, "x")
  text = f.lower(xs).compile().as_text()
  assert collective_kinds(text) <= {"collective-permute"}
  assert local_shapes(the_custom_call(text, STENCIL)) == [(3, 8 + lo + hi)]


@pytest.mark.parametrize("mode", list(MODES))
def test_2d_stencil_on_a_2x4_mesh_takes_the_corners(partitioner, mesh2x4, mode):
  x = rng(2).standard_normal((2, 16, 32)).astype(np.float64)
  with jax.enable_x64(True):
    xs = put(x, mesh2x4, P(None, "a", "b"))
    f = jax.jit(lambda x: stencil(x, 2, 1, mode, rank=2))
    out = f(xs)
    np.testing.assert_array_equal(np.asarray(out), unsharded(x, 2, 1, mode, rank=2))
    text = f.lower(xs).compile().as_text()
  assert collective_kinds(text) == {"collective-permute"}
  assert local_shapes(the_custom_call(text, STENCIL)) == [(2, 8 + 3, 8 + 3)]


def test_batch_dims_and_halo_dims_split_together(partitioner, mesh2x4):
  x = rng(3).standard_normal((4, 40)).astype(np.float32)
  xs = put(x, mesh2x4, P("a", "b"))
  f = jax.jit(lambda x: stencil(x, 1, 2, "reflect"))
  out = f(xs)
  np.testing.assert_array_equal(np.asarray(out), unsharded(x, 1, 2, "reflect"))
  assert out.sharding.spec == P("a", "b")
  text = f.lower(xs).compile().as_text()
  assert collective_kinds(text) == {"collective-permute"}
  assert local_shapes(the_custom_call(text, STENCIL)) == [(2, 10 + 3)]


@pytest.mark.parametrize("n, lo, hi, seen", [(61, 1, 2, 8 + 3), (30, 1, 2, 8 + 3),
                                              (16, 1, 2, 4 + 3), (24, 2, 2, 6 + 4),
                                              (16, 4, 4, 8 + 8), (6, 2, 2, 6)])
def test_splits_the_window_cannot_take_are_made_coarser_or_kept_whole(partitioner, mesh8, n,
                                                                     lo, hi, seen):
  """61 over 8 is uneven, parts of 8 and a last of 5 >= lo + hi: split 8
  ways. 30 over 8 leaves a last part of 2, 16 over 8 and 24 over 8 parts
  shorter than lo + hi: 4 parts instead (the other factor of 2 replicated;
  30: parts of 8, the last 6), 16 with lo + hi = 8 two parts. 6 takes no
  split at all: whole. The values stay exact."""
  x = rng(4).standard_normal((4, n)).astype(np.float32)
  f = constrained(lambda x: stencil(x, lo, hi, "nearest"), mesh8, P(None, "x"))
  np.testing.assert_array_equal(np.asarray(f(x)), unsharded(x, lo, hi, "nearest"))
  (shape,) = local_shapes(the_custom_call(f.lower(x).compile().as_text(), STENCIL))
  assert shape[-1] == seen


def test_a_halo_of_width_zero_needs_no_exchange(partitioner, mesh8):
  x = rng(5).standard_normal((64,)).astype(np.float32)
  xs = put(x, mesh8, P("x"))
  f = jax.jit(lambda x: stencil(x, 0, 0, "zero"))
  np.testing.assert_array_equal(np.asarray(f(xs)), unsharded(x, 0, 0, "zero"))
  assert not collective_kinds(f.lower(xs).compile().as_text())


def test_explicit_mesh_types_the_results_with_the_halo_sharding(partitioner):
  mesh = jax.make_mesh((2, 4), ("a", "b"), axis_types=(AxisType.Explicit,) * 2)
  x = rng(6).standard_normal((4, 40)).astype(np.float32)
  with jax.set_mesh(mesh):
    xs = put(x, mesh, P("a", "b"))
    f = jax.jit(lambda x: stencil(x, 1, 2, "reflect"))
    out = f(xs)
    assert jax.typeof(out).sharding.spec == P("a", "b")
    text = f.lower(xs).compile().as_text()
  np.testing.assert_array_equal(np.asarray(out), unsharded(x, 1, 2, "reflect"))
  assert collective_kinds(text) == {"collective-permute"}


def laplacian(u):
  return bp.ffi_call(LAPLACIAN, S(u.shape, u.dtype), signature="(n,m)->(n,m)",
                     halo={"n": 1, "m": 1})(u)


def heat(u, steps, step_fn):
  return jax.lax.fori_loop(0, steps, lambda i, u: u + 0.1 * step_fn(u), u)


def test_a_loop_of_steps_stays_sharded_one_exchange_per_step(partitioner, mesh2x4):
  u = rng(7).standard_normal((32, 64)).astype(np.float32)
  us = put(u, mesh2x4, P("a", "b"))
  f = jax.jit(lambda u: heat(u, 5, laplacian))
  out = f(us)
  plain = lambda u: jax.ffi.ffi_call(LAPLACIAN, S(u.shape, u.dtype))(u)
  want = jax.jit(lambda u: heat(u, 5, plain))(u)
  np.testing.assert_array_equal(np.asarray(out), np.asarray(want))
  assert out.sharding.spec == P("a", "b")
  text = f.lower(us).compile().as_text()
  # Two halo dims, two directions: four permutes in the loop body, nothing else.
  assert collective_kinds(text) == {"collective-permute"}
  assert text.count("collective-permute(") + text.count("collective-permute-start(") == 4
  assert local_shapes(the_custom_call(text, LAPLACIAN)) == [(16 + 2, 16 + 2)]


def test_partition_ffi_target_gives_a_package_s_calls_the_halo(partitioner, mesh8):
  plain = lambda x: jax.ffi.ffi_call(STENCIL, S(x.shape, x.dtype))(
      x, **attrs(2, 1, "reflect"))
  x = rng(8).standard_normal((2, 64)).astype(np.float32)
  xs = put(x, mesh8, P(None, "x"))
  bp.partition_ffi_target(STENCIL, signature="(n)->(n)", halo={"n": bp.Halo(2, 1)})
  try:
    f = jax.jit(plain)
    np.testing.assert_array_equal(np.asarray(f(xs)), unsharded(x, 2, 1, "reflect"))
    text = f.lower(xs).compile().as_text()
  finally:
    bp.unpartition(STENCIL)
  assert collective_kinds(text) == {"collective-permute"}
  assert local_shapes(the_custom_call(text, STENCIL)) == [(2, 8 + 3)]


def test_the_decorator_follows_the_halo_dim_into_each_call(partitioner, mesh8):
  @bp.batch_partitionable(signature="(n)->(n)", halo={"n": bp.Halo(2, 1)})
  def twice(x):
    # Two stencil calls, each local within the declared window, around jnp.
    y = jax.ffi.ffi_call(STENCIL, S(x.shape, x.dtype))(x, **attrs(1, 1, "reflect"))
    return jax.ffi.ffi_call(STENCIL, S(x.shape, x.dtype))(2 * y, **attrs(1, 0, "zero"))

  x = rng(9).standard_normal((2, 64)).astype(np.float32)
  xs = put(x, mesh8, P(None, "x"))
  f = jax.jit(twice)
  want = unsharded(2 * unsharded(x, 1, 1, "reflect"), 1, 0, "zero")
  np.testing.assert_array_equal(np.asarray(f(xs)), want)
  text = f.lower(xs).compile().as_text()
  assert collective_kinds(text) == {"collective-permute"}
  assert text.count(f'custom_call_target="{STENCIL}"') == 2


def test_vmap_adds_a_batch_dim_and_keeps_the_halo(partitioner, mesh2x4):
  x = rng(10).standard_normal((4, 3, 64)).astype(np.float32)
  xs = put(x, mesh2x4, P("a", None, "b"))
  f = jax.jit(jax.vmap(lambda x: stencil(x, 1, 2, "reflect")))
  np.testing.assert_array_equal(np.asarray(f(xs)), unsharded(x, 1, 2, "reflect"))
  text = f.lower(xs).compile().as_text()
  assert collective_kinds(text) == {"collective-permute"}
  assert local_shapes(the_custom_call(text, STENCIL)) == [(2, 3, 16 + 3)]


def test_export_round_trip_keeps_the_halo(partitioner, mesh2x4):
  """Exported under each partitioner, called under Shardy (jax 0.10 cannot
  call a GSPMD artifact under GSPMD): the call gets its Shardy rule, with
  the halo factor, when it is called."""
  x = rng(11).standard_normal((4, 64)).astype(np.float32)
  spec = NamedSharding(mesh2x4, P("a", "b"))
  exported = jax.export.export(
      jax.jit(lambda x: stencil(x, 2, 1, "nearest")),
      disabled_checks=[jax.export.DisabledSafetyCheck.custom_call(STENCIL)])(
      S(x.shape, x.dtype, sharding=spec))
  assert "$h:n=2.1:0.-1:0.-1" in exported.mlir_module()
  restored = jax.export.deserialize(exported.serialize())
  previous = jax.config.jax_use_shardy_partitioner
  jax.config.update("jax_use_shardy_partitioner", True)
  try:
    f = jax.jit(restored.call)
    xs = put(x, mesh2x4, P("a", "b"))
    out, text = f(xs), f.lower(xs).compile().as_text()
  finally:
    jax.config.update("jax_use_shardy_partitioner", previous)
  np.testing.assert_array_equal(np.asarray(out), unsharded(x, 2, 1, "nearest"))
  assert collective_kinds(text) == {"collective-permute"}


def test_explain_names_the_permutes_as_the_declared_halo(partitioner, mesh8):
  x = rng(12).standard_normal((3, 64)).astype(np.float32)
  xs = put(x, mesh8, P(None, "x"))
  report = bp.explain(jax.jit(lambda x: stencil(x, 1, 2, "reflect")), xs)
  (call,) = report.calls
  assert [(h.name, h.size, h.parts) for h in call.halo_dims] == [("n", 64, 8)]
  assert [c.kind for c in call.collectives_before if c.declared_halo] == [
      "collective-permute"] * 2
  assert call.replication == 1
  text = str(report)
  assert "collective-permute 36 B (the declared halo)" in text
  assert "in 8 parts of 8, each device's window 11 elements" in flat(text)
  # Parts of 8 are shorter than lo + hi = 9: 4 parts of 16, each on 2 devices.
  coarser = bp.explain(jax.jit(lambda x: stencil(x, 4, 5, "reflect")), xs)
  assert "in 4 parts of 16, each device's window 25 elements" in flat(str(coarser))
  assert coarser.calls[0].replication == 2
  whole = bp.explain(jax.jit(lambda x: stencil(x, 30, 30, "reflect")), xs)
  assert "whole on every device (a halo dim stays split only where" in flat(str(whole))


def test_explain_counts_two_parts_whose_window_is_the_whole_dim(partitioner, mesh2x4):
  """Two parts of 4 with lo + hi = 4: each device's window is 8 elements,
  the dim's global size, yet the dim is split (the permutes say so)."""
  x = rng(14).standard_normal((3, 8)).astype(np.float32)
  f = jax.jit(lambda x: stencil(x, 1, 3, "reflect"))
  split = bp.explain(f, put(x, mesh2x4, P(None, "a")))
  assert [(h.size, h.parts) for h in split.calls[0].halo_dims] == [(8, 2)]
  assert "in 2 parts of 4, each device's window 8 elements" in flat(str(split))
  whole = bp.explain(f, put(x, mesh2x4, P()))
  assert [(h.size, h.parts) for h in whole.calls[0].halo_dims] == [(8, 1)]


def test_inside_shard_map_each_device_runs_its_block(partitioner, mesh8):
  """Manual mode: the body sees its block, and an exchange is the body's
  job, as for every batchpart call; the kernel runs on the block as is."""
  x = rng(13).standard_normal((2, 64)).astype(np.float32)
  f = jax.jit(jax.shard_map(lambda b: stencil(b, 1, 1, "nearest"), mesh=mesh8,
                            in_specs=P(None, "x"), out_specs=P(None, "x")))
  xs = put(x, mesh8, P(None, "x"))
  want = np.concatenate([unsharded(x[:, 8 * k:8 * k + 8], 1, 1, "nearest")
                         for k in range(8)], axis=1)
  np.testing.assert_array_equal(np.asarray(f(xs)), want)
  assert not collective_kinds(f.lower(xs).compile().as_text())
