"""bp.partition_ffi_target: a package that calls jax.ffi.ffi_call directly
(inside jax.custom_batching.custom_vmap, as real packages do) made
partitionable with one line; other targets untouched; undo and redo in one
process, also while another thread calls; Explicit-mode types; errors naming
the entry point. Under Shardy and GSPMD."""

import re
import time

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from jax.interpreters import mlir
from jax.sharding import AxisType, PartitionSpec as P

import batchpart as bp
from batchpart import testing as kernels

from helpers import collective_kinds, local_shapes, put, run_concurrently, the_custom_call

SOFTMAX = "batchpart_test_softmax"
f32 = np.float32


def _sds(shape):
  return jax.ShapeDtypeStruct(shape, f32)


# ---- a package, as a user finds it: no primitive of its own ------------------

@jax.custom_batching.custom_vmap
def package_softmax(x):
  """One problem per call: x of shape (n,)."""
  return jax.ffi.ffi_call(SOFTMAX, (_sds(x.shape), _sds(())))(x)


@package_softmax.def_vmap
def _package_softmax_vmap(axis_size, in_batched, x):
  del axis_size, in_batched
  # The whole batch in one call: x of shape (batch, n).
  y, lse = jax.ffi.ffi_call(SOFTMAX, (_sds(x.shape), _sds(x.shape[:-1])))(x)
  return (y, lse), (True, True)


def package_axpy(x, y):
  return jax.ffi.ffi_call("batchpart_test_axpy", _sds(x.shape))(x, y, alpha=np.float64(2.0))


def _program(hlo_text: str) -> str:
  """A compiled module's computations, without the source locations of the
  lines that lowered it."""
  return re.sub(r"(, )?metadata=\{[^}]*\}", "", hlo_text.split("\nFileNames")[0])


@pytest.fixture
def declared():
  bp.partition_ffi_target(SOFTMAX, signature="(n)->(n),()")
  yield
  bp.unpartition(SOFTMAX)


def _x(seed=0):
  return np.random.default_rng(seed).standard_normal((64, 16)).astype(f32)


@pytest.mark.timeout(120)
def test_a_package_call_inside_custom_vmap_is_partitioned(partitioner, mesh8, declared):
  f = jax.jit(jax.vmap(package_softmax))
  for spec in (P("x"), P(None, "x")):
    xs = put(_x(), mesh8, spec)
    text = f.lower(xs).compile().as_text()
    assert local_shapes(the_custom_call(text, SOFTMAX)) == [(8, 16)]
    if spec == P("x"):
      assert collective_kinds(text) == set()
    kernels.reset_batch_elements_processed()
    y, lse = f(xs)
    jax.block_until_ready((y, lse))
    assert kernels.batch_elements_processed() == 64
    want_y, want_lse = kernels.softmax_reference(_x())
    np.testing.assert_allclose(y, want_y, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-5, atol=1e-6)


@pytest.mark.timeout(120)
def test_other_targets_compile_as_without_batchpart(partitioner, mesh8):
  x, y = put(_x(1), mesh8, P("x")), put(_x(2), mesh8, P("x"))
  before = jax.jit(package_axpy).lower(x, y).compile().as_text()
  bp.partition_ffi_target(SOFTMAX, signature="(n)->(n),()")
  try:
    after = jax.jit(package_axpy).lower(x, y).compile().as_text()
  finally:
    bp.unpartition(SOFTMAX)
  assert _program(after) == _program(before)
  np.testing.assert_allclose(jax.jit(package_axpy)(x, y), 2 * _x(1) + _x(2), rtol=1e-6)


@pytest.mark.timeout(120)
def test_undo_and_redo_in_one_process(partitioner, mesh8):
  traces = []

  def f(x):
    traces.append(1)
    return jax.vmap(package_softmax)(x)

  jitted = jax.jit(f)
  xs = put(_x(3), mesh8, P("x"))
  stock = jitted.lower(xs).compile().as_text()
  assert "all-gather" in collective_kinds(stock)   # XLA's default: gather, replicate
  jitted(xs)
  for _ in range(2):   # declare, undo, declare again
    bp.partition_ffi_target(SOFTMAX, signature="(n)->(n),()")
    text = jitted.lower(xs).compile().as_text()
    assert local_shapes(the_custom_call(text, SOFTMAX)) == [(8, 16)]
    np.testing.assert_allclose(jitted(xs)[0], kernels.softmax_reference(_x(3))[0],
                               rtol=1e-5, atol=1e-6)
    bp.unpartition(SOFTMAX)
    assert _program(jitted.lower(xs).compile().as_text()) == _program(stock)
  n = len(traces)
  jax.block_until_ready(jitted(xs))   # the trace lowered just above: no new one
  assert len(traces) == n
  bp.partition_ffi_target(SOFTMAX, signature="(n)->(n),()")
  bp.unpartition(SOFTMAX)
  kernels.reset_batch_elements_processed()
  jax.block_until_ready(jitted(xs))   # every change is a new key: traced again, stock
  assert len(traces) == n + 1 and kernels.batch_elements_processed() == 8 * 64


@pytest.mark.timeout(120)
def test_a_jit_compiled_before_the_declaration_follows_it(mesh8):
  f = jax.jit(jax.vmap(package_softmax))
  xs = put(_x(4), mesh8, P("x"))
  compiled = f.lower(xs).compile()   # compiled objects never change
  f(xs)
  bp.partition_ffi_target(SOFTMAX, signature="(n)->(n),()")
  try:
    text = f.lower(xs).compile().as_text()
    assert local_shapes(the_custom_call(text, SOFTMAX)) == [(8, 16)]
    assert "all-gather" in collective_kinds(compiled.as_text())
    np.testing.assert_allclose(f(xs)[0], compiled(xs)[0], rtol=1e-5, atol=1e-6)
  finally:
    bp.unpartition(SOFTMAX)


@pytest.mark.timeout(120)
def test_explicit_mode_results_are_batch_sharded(declared):
  mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Explicit,))
  with jax.set_mesh(mesh):
    bp.unpartition(SOFTMAX)
    bp.partition_ffi_target(SOFTMAX, num_batch_dims=1)
    xs = jax.device_put(_x(5), P("x"))
    y, lse = jax.jit(jax.vmap(package_softmax))(xs)
    assert jax.typeof(y).sharding.spec == P("x", None)
    assert jax.typeof(lse).sharding.spec == P("x")
    np.testing.assert_allclose(y, kernels.softmax_reference(_x(5))[0], rtol=1e-5,
                               atol=1e-6)


@pytest.mark.timeout(60)
def test_a_call_that_does_not_fit_names_the_entry_point_and_target(mesh8, declared):
  bp.unpartition(SOFTMAX)
  bp.partition_ffi_target(SOFTMAX, num_batch_dims=1)
  with pytest.raises(ValueError, match=r"partition_ffi_target\('batchpart_test_softmax'\)"
                     r".*num_batch_dims=1 exceeds the rank of result 1"):
    jax.jit(package_softmax).lower(np.ones(16, f32))   # one problem: no batch dim


@pytest.mark.timeout(60)
def test_declaration_errors():
  with pytest.raises(TypeError, match="target_name must be a non-empty str"):
    bp.partition_ffi_target(3, num_batch_dims=1)
  with pytest.raises(ValueError, match="exactly one of num_batch_dims and signature"):
    bp.partition_ffi_target(SOFTMAX)
  with pytest.raises(ValueError, match="unpartition.*'never_declared'.*not partitioned"):
    bp.unpartition("never_declared")
  bp.partition_ffi_target(SOFTMAX, num_batch_dims=1)
  try:
    bp.partition_ffi_target(SOFTMAX, num_batch_dims=np.int64(1))   # the same: no-op
    with pytest.raises(ValueError, match="already partitioned.*unpartition"):
      bp.partition_ffi_target(SOFTMAX, signature="(n)->(n),()")
  finally:
    bp.unpartition(SOFTMAX)


# ---- Explicit mode: a declared call is typed as bp.ffi_call types it ----------

CORE_SUM = "batchpart_test_core_sum"


def _core_sum(call, x, y, out_shape, x_lead, y_lead, out_lead):
  """batchpart_test_core_sum through ``call`` (jax's or batchpart's
  ffi_call): each core dim before the batch dims counts as a lead."""
  attrs = dict(x_lead=np.int64(x_lead), x_trail=np.int64(x.ndim - x_lead - 1),
               y_lead=np.int64(y_lead), y_trail=np.int64(y.ndim - y_lead - 1),
               out_lead=np.int64(out_lead), out_trail=np.int64(len(out_shape) - out_lead - 1))
  return call(_sds(out_shape))(x, y, **attrs)


def _core_sum_reference(x, y, x_lead, y_lead, out_shape, out_lead):
  """Each batch element's sum of both operands' core elements, everywhere in
  the result's core dims (y's batch dim broadcasts)."""
  xs = np.moveaxis(x, x_lead, 0).reshape(x.shape[x_lead], -1).sum(1)
  ys = np.moveaxis(y, y_lead, 0).reshape(y.shape[y_lead], -1).sum(1)
  sums = np.broadcast_to(xs + ys, (x.shape[x_lead],))
  core = [d for i, d in enumerate(out_shape) if i != out_lead]
  return np.moveaxis(np.broadcast_to(sums, (*core, sums.size)), -1, out_lead)


# (name, target, declaration, operand shapes and specs, per-call arguments)
EXPLICIT_CASES = {
    "num_batch_dims": dict(num_batch_dims=1),
    "signature": dict(signature="(n)->(n),()"),
    "signature with a leading ...": dict(signature="(...,n)->(...,n),(...)"),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("declaration", EXPLICIT_CASES.values(), ids=EXPLICIT_CASES.keys())
def test_explicit_mode_types_a_declared_softmax_like_bp_ffi_call(partitioner, declaration):
  mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Explicit,))
  x = _x(6)
  bp.partition_ffi_target(SOFTMAX, **declaration)
  try:
    with jax.set_mesh(mesh):
      xs = jax.device_put(x, P("x"))
      f = jax.jit(jax.vmap(package_softmax))
      want = jax.jit(lambda x: bp.ffi_call(SOFTMAX, (_sds(x.shape), _sds(x.shape[:-1])),
                                           **declaration)(x))
      (y, lse), (want_y, want_lse) = f(xs), want(xs)
      text = f.lower(xs).compile().as_text()
  finally:
    bp.unpartition(SOFTMAX)
  assert (jax.typeof(y), jax.typeof(lse)) == (jax.typeof(want_y), jax.typeof(want_lse))
  assert jax.typeof(y).sharding.spec == P("x", None)
  assert collective_kinds(text) == set()
  assert local_shapes(the_custom_call(text, SOFTMAX)) == [(8, 16)]
  np.testing.assert_allclose(y, kernels.softmax_reference(x)[0], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(lse, kernels.softmax_reference(x)[1], rtol=1e-5, atol=1e-6)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("y_batch", [16, 1], ids=["equal batch", "broadcast batch"])
def test_explicit_mode_types_batch_dims_anywhere_like_bp_ffi_call(partitioner, y_batch):
  # x: (2, batch, 3), one core dim on each side; y: (batch,) or (1,), which
  # broadcasts; the result: (batch, 4).
  mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Explicit,))
  signature = "(a,...,t),(...)->(...,f)"
  r = np.random.default_rng(7)
  x = r.standard_normal((2, 16, 3)).astype(f32)
  y = r.standard_normal((y_batch,)).astype(f32)
  out_shape = (16, 4)
  bp.partition_ffi_target(CORE_SUM, signature=signature)
  try:
    with jax.set_mesh(mesh):
      xs, ys = jax.device_put(x, P(None, "x")), jax.device_put(y, P())
      f = jax.jit(lambda x, y: _core_sum(lambda r: jax.ffi.ffi_call(CORE_SUM, r), x, y,
                                         out_shape, 1, 0, 0))
      want = jax.jit(lambda x, y: _core_sum(
          lambda r: bp.ffi_call(CORE_SUM, r, signature=signature), x, y, out_shape, 1, 0, 0))
      out, want_out = f(xs, ys), want(xs, ys)
      text = f.lower(xs, ys).compile().as_text()
  finally:
    bp.unpartition(CORE_SUM)
  assert jax.typeof(out) == jax.typeof(want_out)
  assert jax.typeof(out).sharding.spec == P("x", None)
  assert "all-gather" not in collective_kinds(text)
  assert local_shapes(the_custom_call(text, CORE_SUM))[0] == (2, 2, 3)
  np.testing.assert_allclose(out, _core_sum_reference(x, y, 1, 0, out_shape, 0), rtol=1e-5,
                             atol=1e-5)


# ---- declarations changed while another call traces and lowers ---------------

# Batch elements the softmax kernel processes for one call on _x(): the
# partitioned program gives each device its 8 rows, the stock one gathers all
# 64 rows onto every device.
PARTITIONED, STOCK = 64, 8 * 64

_at_lowering: list = []   # callables the next lowering of lowering_hook_p runs


def _run_at_lowering(ctx, x):
  while _at_lowering:
    _at_lowering.pop(0)()
  return [x]


# An identity whose lowering runs _at_lowering: jax has read its cache key by
# then, and lowers the package's call after it.
lowering_hook_p = jax.extend.core.Primitive("batchpart_test_lowering_hook")
lowering_hook_p.def_abstract_eval(lambda x: x)
lowering_hook_p.def_impl(lambda x: x)
mlir.register_lowering(lowering_hook_p, _run_at_lowering, cacheable=False)


def _fresh_package_program():
  """A new jax.jit function (nothing of it cached) of the package's softmax,
  with lowering_hook_p lowered before the package's call."""
  return jax.jit(lambda x: jax.vmap(package_softmax)(lowering_hook_p.bind(x))[0])


def _processed(f, xs) -> int:
  """Batch elements the kernel processed for one call of ``f``."""
  kernels.reset_batch_elements_processed()
  jax.block_until_ready(f(xs))
  return kernels.batch_elements_processed()


def _declare():
  bp.partition_ffi_target(SOFTMAX, signature="(n)->(n),()")


@pytest.mark.timeout(120)
def test_a_declaration_made_while_a_call_lowers_does_not_outlive_it(partitioner, mesh8):
  xs = put(_x(8), mesh8, P("x"))
  f = _fresh_package_program()
  _at_lowering.append(_declare)   # after jax read "nothing declared" for this call
  try:
    jax.block_until_ready(f(xs))
  finally:
    bp.unpartition(SOFTMAX)
  assert not _at_lowering
  assert _processed(f, xs) == STOCK   # nothing declared: the stock program
  np.testing.assert_allclose(f(xs), kernels.softmax_reference(_x(8))[0], rtol=1e-5,
                             atol=1e-6)


@pytest.mark.timeout(120)
def test_a_withdrawal_made_while_a_call_lowers_does_not_outlive_it(partitioner, mesh8):
  xs = put(_x(9), mesh8, P("x"))
  f = _fresh_package_program()
  _declare()
  _at_lowering.append(lambda: bp.unpartition(SOFTMAX))
  jax.block_until_ready(f(xs))
  assert not _at_lowering
  _declare()   # the same declaration as when f's first call started
  try:
    assert _processed(f, xs) == PARTITIONED
  finally:
    bp.unpartition(SOFTMAX)


@st.composite
def _interleavings(draw):
  """Two threads' steps: pairs of declare/withdraw (ending withdrawn) and the
  first calls of fresh jit functions, each followed by a drawn pause, and a
  pause inside each call's lowering, where the other thread may act."""
  pause = st.sampled_from([0.0, 0.0005, 0.002, 0.01])
  changes = draw(st.lists(st.tuples(pause, pause), min_size=1, max_size=6),
                 label="pauses after each declare and withdraw")
  calls = draw(st.lists(st.tuples(pause, pause), min_size=1, max_size=6),
               label="pause in each call's lowering and after it")
  return changes, calls


@pytest.mark.timeout(300)
@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(schedule=_interleavings())
def test_drawn_interleavings_of_changes_and_first_calls_leave_no_stale_program(
    partitioner, mesh8, schedule):
  changes, calls = schedule
  xs = put(_x(10), mesh8, P("x"))
  functions = [_fresh_package_program() for _ in calls]

  def changer():
    for after_declare, after_withdraw in changes:
      _declare()
      time.sleep(after_declare)
      bp.unpartition(SOFTMAX)
      time.sleep(after_withdraw)

  def caller():
    for f, (in_lowering, after) in zip(functions, calls):
      _at_lowering.append(lambda s=in_lowering: time.sleep(s))
      jax.block_until_ready(f(xs))
      time.sleep(after)

  try:
    run_concurrently(changer, caller)
  finally:
    _at_lowering.clear()
  # Withdrawn at the end: every function runs the stock program now.
  assert [_processed(f, xs) for f in functions] == [STOCK] * len(functions)
