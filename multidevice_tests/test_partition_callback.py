"""bp.partition_callback: a package's own jax.pure_callback / io_callback
calls (a module function, a functools.partial, a bound method, a callable
object, a callback with a shared operand), unchanged, run per batch shard on
8 simulated devices under Shardy and GSPMD: values against NumPy and stock,
the calls each device makes and their shapes, no all-gather in the compiled
HLO; vmap, custom_vjp, reductions, uneven and replicated batches; other
callbacks compile exactly as before; declare, withdraw and redeclare, also
while another thread compiles."""

import functools
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from jax.sharding import PartitionSpec as P

import batchpart as bp

from helpers import collective_kinds, compiled_text, put, rng, run_concurrently

S = jax.ShapeDtypeStruct
f32 = np.float32


class Calls:
  """The shapes of every call's first operand (devices call concurrently)."""

  def __init__(self):
    self.shapes, self.lock = [], threading.Lock()

  def record(self, x):
    with self.lock:
      self.shapes.append(tuple(np.shape(x)))

  def take(self):
    with self.lock:
      out, self.shapes = sorted(self.shapes), []
    return out


CALLS = Calls()


# ---- a package, as a user finds it -------------------------------------------

def rowsum(x):
  CALLS.record(x)
  return np.sum(np.asarray(x), axis=-1)


@jax.jit
def package_rowsum(x):
  return jax.pure_callback(rowsum, S(x.shape[:-1], x.dtype), x, vmap_method="expand_dims")


def scaled_rowsum(x, *, scale):
  CALLS.record(x)
  return scale * np.sum(np.asarray(x), axis=-1)


@jax.jit
def package_partial(x):
  return jax.pure_callback(functools.partial(scaled_rowsum, scale=f32(2)),
                           S(x.shape[:-1], x.dtype), x)


class Model:
  def __init__(self, shift):
    self.shift = f32(shift)

  def log_prob(self, x):
    CALLS.record(x)
    return -0.5 * np.sum(np.asarray(x) ** 2, axis=-1) + self.shift

  def __call__(self, x):
    CALLS.record(x)
    return np.asarray(x) * 2

  def apply(self, x):
    return jax.pure_callback(self.log_prob, S(x.shape[:-1], x.dtype), x)


def affine(x, w):
  """A batch of rows times a weight matrix every call needs whole."""
  CALLS.record(x)
  return np.asarray(x) @ np.asarray(w)


@jax.jit
def package_affine(x, w):
  return jax.pure_callback(affine, S((x.shape[0], w.shape[1]), x.dtype), x, w)


def _x(n=16, k=4, seed=0):
  return rng(seed).standard_normal((n, k)).astype(f32)


@pytest.fixture
def declared():
  """Functions declared by the test; withdrawn afterwards whatever happens."""
  names = []
  def declare(fn, **decl):
    bp.partition_callback(fn, **decl)
    names.append(fn)
  CALLS.take()   # nothing another test left running may count here
  yield declare
  for fn in names:
    try:
      bp.unpartition(fn)
    except ValueError:
      pass
  CALLS.take()


def _run(f, *args):
  out = jax.block_until_ready(f(*args))
  return np.asarray(out), CALLS.take()


# ---- the four patterns -------------------------------------------------------

@pytest.mark.timeout(120)
def test_a_module_function_runs_per_shard(partitioner, mesh8, declared):
  x = _x()
  xs = put(x, mesh8, P("x"))
  stock, stock_calls = _run(package_rowsum, xs)
  assert stock_calls == [(16, 4)]
  assert collective_kinds(compiled_text(package_rowsum, xs)) != set()   # gathered
  declared(rowsum, num_batch_dims=1)
  out, calls = _run(package_rowsum, xs)
  assert calls == [(2, 4)] * 8
  np.testing.assert_array_equal(out, stock)
  np.testing.assert_allclose(out, x.sum(-1), rtol=1e-6)
  assert collective_kinds(compiled_text(package_rowsum, xs)) == set()
  assert jax.block_until_ready(package_rowsum(xs)).sharding.spec == P("x")
  CALLS.take()


@pytest.mark.timeout(120)
def test_a_partial_is_recognised_by_its_function(partitioner, mesh8, declared):
  x = _x(seed=1)
  xs = put(x, mesh8, P("x"))
  declared(scaled_rowsum, num_batch_dims=1)
  out, calls = _run(package_partial, xs)
  assert calls == [(2, 4)] * 8
  np.testing.assert_allclose(out, 2 * x.sum(-1), rtol=1e-6)


@pytest.mark.timeout(120)
def test_a_bound_method_is_recognised_by_the_class_function(partitioner, mesh8, declared):
  x = _x(seed=2)
  xs = put(x, mesh8, P("x"))
  declared(Model.log_prob, num_batch_dims=1)
  for shift in (0.0, 3.0):   # any instance
    out, calls = _run(jax.jit(Model(shift).apply), xs)
    assert calls == [(2, 4)] * 8
    np.testing.assert_allclose(out, -0.5 * (x ** 2).sum(-1) + shift, rtol=1e-5)


@pytest.mark.timeout(120)
def test_a_callable_object_is_recognised_by_its_class_call(partitioner, mesh8, declared):
  x = _x(seed=3)
  xs = put(x, mesh8, P("x"))
  declared(Model.__call__, num_batch_dims=1)
  f = jax.jit(lambda x: jax.pure_callback(Model(0), S(x.shape, x.dtype), x))
  out, calls = _run(f, xs)
  assert calls == [(2, 4)] * 8
  np.testing.assert_array_equal(out, 2 * x)


@pytest.mark.timeout(120)
def test_a_shared_operand_is_passed_whole_to_every_call(partitioner, mesh8, declared):
  x, w = _x(seed=4), rng(5).standard_normal((4, 3)).astype(f32)
  xs, ws = put(x, mesh8, P("x")), put(w, mesh8, P())
  declared(affine, signature="(k),(k,m)->(m)")
  out, calls = _run(package_affine, xs, ws)
  assert calls == [(2, 4)] * 8
  np.testing.assert_allclose(out, x @ w, rtol=1e-5)
  assert collective_kinds(compiled_text(package_affine, xs, ws)) == set()


# ---- what else a package does ------------------------------------------------

@pytest.mark.timeout(120)
def test_other_callbacks_compile_exactly_as_before(partitioner, mesh8, declared):
  xs = put(_x(), mesh8, P("x"))
  before = package_partial.lower(xs).as_text()
  declared(rowsum, num_batch_dims=1)
  assert package_partial.lower(xs).as_text() == before
  _, calls = _run(package_partial, xs)
  assert calls == [(16, 4)]


@pytest.mark.timeout(120)
def test_withdraw_and_redeclare_in_one_process(partitioner, mesh8, declared):
  xs = put(_x(), mesh8, P("x"))
  declared(rowsum, num_batch_dims=1)
  assert _run(package_rowsum, xs)[1] == [(2, 4)] * 8
  bp.unpartition(rowsum)
  assert _run(package_rowsum, xs)[1] == [(16, 4)]
  declared(rowsum, num_batch_dims=1)
  assert _run(package_rowsum, xs)[1] == [(2, 4)] * 8
  with pytest.raises(ValueError, match="another declaration"):
    bp.partition_callback(rowsum, signature="(k)->()")
  bp.partition_callback(rowsum, num_batch_dims=1)   # the same: nothing to do


@pytest.mark.timeout(120)
def test_uneven_and_replicated_batches(partitioner, mesh8, declared):
  declared(rowsum, num_batch_dims=1)
  x = _x(13, seed=6)
  sharded = jax.jit(lambda x: package_rowsum(
      jax.lax.with_sharding_constraint(x, jax.sharding.NamedSharding(mesh8, P("x")))))
  out, calls = _run(sharded, x)
  assert calls == [(1, 4)] + [(2, 4)] * 6   # padding never passed
  np.testing.assert_allclose(out, x.sum(-1), rtol=1e-6)
  x = _x(16, seed=7)
  out, calls = _run(package_rowsum, put(x, mesh8, P()))   # split, not computed 8 times
  assert calls == [(2, 4)] * 8
  np.testing.assert_allclose(out, x.sum(-1), rtol=1e-6)


@pytest.mark.timeout(120)
def test_io_callback_unordered_per_shard_and_ordered_left_to_jax(partitioner, mesh8,
                                                                 declared):
  seen = Calls()

  def log_rows(x):
    seen.record(x)
    return np.zeros(np.shape(x)[:1], np.int32)

  declared(log_rows, num_batch_dims=1)
  xs = put(_x(), mesh8, P("x"))
  unordered = jax.jit(lambda x: jax.experimental.io_callback(
      log_rows, S(x.shape[:1], np.int32), x))
  jax.block_until_ready(unordered(xs))
  assert seen.take() == [(2, 4)] * 8
  ordered = jax.jit(lambda x: jax.experimental.io_callback(
      log_rows, S(x.shape[:1], np.int32), x, ordered=True))
  with pytest.warns(UserWarning, match="ordered"):
    jax.block_until_ready(ordered(xs))
  assert seen.take() == [(16, 4)]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("vmap_method", ["expand_dims", "broadcast_all",
                                         "legacy_vectorized", "sequential"])
def test_vmap_keeps_the_declared_batch_dims(partitioner, mesh8, declared, vmap_method):
  def scale_rows(x, s):
    CALLS.record(x)
    return np.asarray(x) * np.asarray(s)[..., None]

  def call(x, s):
    return jax.pure_callback(scale_rows, S(x.shape, x.dtype), x, s,
                             vmap_method=vmap_method)

  declared(scale_rows, num_batch_dims=1)
  x = rng(8).standard_normal((3, 16, 4)).astype(f32)
  s = rng(9).standard_normal((16,)).astype(f32)
  xs, ss = put(x, mesh8, P(None, "x")), put(s, mesh8, P("x"))
  out, calls = _run(jax.jit(jax.vmap(call, in_axes=(0, None))), xs, ss)
  np.testing.assert_allclose(out, x * s[None, :, None], rtol=1e-6)
  if vmap_method == "sequential":
    assert calls == [(2, 4)] * 24   # jax's loop, each iteration per shard
  else:
    assert calls == [(3, 2, 4)] * 8


@pytest.mark.timeout(120)
def test_inside_custom_vjp(partitioner, mesh8, declared):
  def square(x):
    CALLS.record(x)
    return np.asarray(x) ** 2

  @jax.custom_vjp
  def f(x):
    return jax.pure_callback(square, S(x.shape, x.dtype), x)

  f.defvjp(lambda x: (f(x), x), lambda x, g: (2 * x * g,))
  declared(square, num_batch_dims=1)
  x = _x(seed=10)
  xs = put(x, mesh8, P("x"))
  loss = jax.jit(jax.value_and_grad(lambda x: jnp.sum(f(x))))
  value, grad = jax.block_until_ready(loss(xs))
  assert CALLS.take() == [(2, 4)] * 8
  np.testing.assert_allclose(value, (x ** 2).sum(), rtol=1e-5)
  np.testing.assert_allclose(grad, 2 * x, rtol=1e-6)


@pytest.mark.timeout(120)
def test_a_declared_reduction_sums_over_sharded_rows(partitioner, mesh8, declared):
  def total(x):
    CALLS.record(x)
    return np.sum(np.asarray(x), axis=0)

  declared(total, signature="(n,k)->(k)", reduce={"n": "sum"})
  x = _x(seed=11)
  xs = put(x, mesh8, P("x"))
  f = jax.jit(lambda x: jax.pure_callback(total, S((4,), x.dtype), x))
  out, calls = _run(f, xs)
  assert calls == [(2, 4)] * 8
  np.testing.assert_allclose(out, x.sum(0), rtol=1e-5)
  assert collective_kinds(compiled_text(f, xs)) == {"all-reduce"}


@pytest.mark.timeout(120)
def test_a_call_that_does_not_fit_names_the_entry_point(mesh8, declared):
  declared(rowsum, num_batch_dims=3)
  with pytest.raises(ValueError, match=r"partition_callback\(rowsum\)"):
    package_rowsum.lower(put(_x(), mesh8, P("x")))


# ---- changes while another thread compiles -----------------------------------

def _fresh_program():
  return jax.jit(lambda x: jax.pure_callback(rowsum, S(x.shape[:-1], x.dtype), x))


@st.composite
def _interleavings(draw):
  pause = st.sampled_from([0.0, 0.0005, 0.002, 0.01])
  changes = draw(st.lists(st.tuples(pause, pause), min_size=1, max_size=5),
                 label="pauses after each declare and withdraw")
  calls = draw(st.lists(pause, min_size=1, max_size=5), label="pause after each call")
  return changes, calls


@pytest.mark.timeout(300)
@settings(max_examples=10, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(schedule=_interleavings())
def test_drawn_interleavings_leave_right_values_and_no_stale_program(partitioner, mesh8,
                                                                     schedule):
  changes, pauses = schedule
  x = _x(seed=12)
  xs = put(x, mesh8, P("x"))
  functions = [_fresh_program() for _ in pauses]

  def changer():
    for after_declare, after_withdraw in changes:
      bp.partition_callback(rowsum, num_batch_dims=1)
      time.sleep(after_declare)
      bp.unpartition(rowsum)
      time.sleep(after_withdraw)

  def caller():
    for f, after in zip(functions, pauses):
      np.testing.assert_allclose(np.asarray(f(xs)), x.sum(-1), rtol=1e-6)
      time.sleep(after)

  run_concurrently(changer, caller)
  CALLS.take()
  # Withdrawn at the end: every function finds the stock program (one call).
  for f in functions:
    assert _run(f, xs)[1] == [(16, 4)]


@pytest.mark.timeout(120)
def test_explicit_mode_types_results_with_the_batch_sharding(partitioner, declared):
  mesh = jax.make_mesh((8,), ("x",), axis_types=(jax.sharding.AxisType.Explicit,))
  declared(rowsum, num_batch_dims=1)
  x = _x(seed=13)
  types = []

  @jax.jit
  def f(x):
    y = jax.pure_callback(rowsum, S(x.shape[:1], x.dtype), x)
    types.append(jax.typeof(y).sharding.spec)
    return y * 2

  with jax.set_mesh(mesh):
    xs = put(x, mesh, P("x"))
    out, calls = _run(f, xs)
    assert types == [P("x")]
    assert calls == [(2, 4)] * 8
    np.testing.assert_allclose(out, 2 * x.sum(-1), rtol=1e-6)
    assert collective_kinds(compiled_text(f, xs)) == set()


@pytest.mark.timeout(120)
def test_a_packages_buffer_callback_runs_per_shard_in_place(partitioner, mesh8, declared):
  from jax.experimental.buffer_callback import buffer_callback

  def double_into(ctx, out, x):
    CALLS.record(x)
    np.asarray(out)[...] = 2 * np.asarray(x)

  f = jax.jit(lambda x: buffer_callback(double_into, S(x.shape, x.dtype))(x))
  x = _x(seed=14)
  xs = put(x, mesh8, P("x"))
  stock, calls = _run(f, xs)
  assert calls == [(16, 4)] * 8   # stock: every device on the whole array
  declared(double_into, num_batch_dims=1)
  out, calls = _run(f, xs)
  assert calls == [(2, 4)] * 8
  np.testing.assert_array_equal(out, stock)
  np.testing.assert_array_equal(out, 2 * x)
  assert collective_kinds(compiled_text(f, xs)) == set()


@pytest.mark.timeout(120)
def test_reduce_is_refused_for_a_packages_io_callback(mesh8, declared):
  def count(x):
    return np.zeros((), np.int32)

  declared(count, signature="(n)->()", reduce={"n": "sum"})
  f = jax.jit(lambda x: jax.experimental.io_callback(count, S((), np.int32), x))
  with pytest.raises(ValueError, match=r"partition_callback\(.*count\).*pure_callback"):
    f.lower(put(_x(8, 1)[:, 0], mesh8, P("x")))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("arrays", [None, "jax", "numpy"])
def test_the_function_gets_jax_arrays_as_from_jax_unless_told(partitioner, mesh8, declared,
                                                               arrays):
  types = Calls()

  def bump_first(x):
    types.record(x)
    with types.lock:
      types.shapes[-1] = type(x)
    return x.at[:, 0].add(1) if isinstance(x, jax.Array) else np.asarray(x) + [1, 0, 0, 0]

  f = jax.jit(lambda x: jax.pure_callback(bump_first, S(x.shape, x.dtype), x))
  x = _x(seed=15)
  xs = put(x, mesh8, P("x"))
  stock = np.asarray(jax.block_until_ready(f(xs)))
  assert all(issubclass(t, jax.Array) for t in types.shapes)   # jax's own convention
  types.shapes.clear()
  declared(bump_first, num_batch_dims=1, **({} if arrays is None else {"arrays": arrays}))
  out = np.asarray(jax.block_until_ready(f(xs)))
  np.testing.assert_array_equal(out, stock)
  want = np.ndarray if arrays == "numpy" else jax.Array
  assert len(types.shapes) == 8 and all(issubclass(t, want) for t in types.shapes)


@pytest.mark.timeout(120)
def test_explain_shows_the_stock_gather_then_the_adopted_call(partitioner, mesh8, declared):
  xs = put(_x(), mesh8, P("x"))
  fn = lambda x: jax.pure_callback(rowsum, S(x.shape[:-1], x.dtype), x)  # noqa: E731
  stock, = bp.explain(fn, xs).calls
  assert stock.single_device == 0 and stock.collectives_before
  declared(rowsum, num_batch_dims=1)
  adopted, = bp.explain(fn, xs).calls
  assert "partition_callback(rowsum)" in str(bp.explain(fn, xs))
  assert adopted.single_device is None
  assert not adopted.collectives_before and not adopted.collectives_after
  assert [tuple(s) for s in adopted.device_operand_shapes] == [(2, 4)]
