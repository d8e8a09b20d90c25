"""bp.pure_callback / bp.io_callback on 8 simulated devices, Shardy and
GSPMD: per-device blocks, collectives in the compiled HLO, the number of
calls and which batch elements each gets (never twice for io_callback, never
padding), and programs that meet in a collective after the callback."""

import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import batchpart as bp
from batchpart import _hlo

from helpers import collective_kinds, compiled_text, local_shapes, put, rng

CPU_CALLBACK = "xla_ffi_python_cpu_callback"
S = jax.ShapeDtypeStruct


class Recorder:
  """Records, per call, the block shapes and its ``index`` (thread-safe:
  several devices call at once)."""

  def __init__(self, fn):
    self.fn, self.calls, self.lock = fn, [], threading.Lock()

  def __call__(self, *args, index):
    with self.lock:
      self.calls.append(([a.shape for a in args], index))
    return self.fn(*args)

  def rows(self) -> list[int]:
    """Every batch row (first batch dim) passed, with repeats."""
    return sorted(r for _, index in self.calls for r in range(index[0].start,
                                                                  index[0].stop))


def _sym(n, k=4, seed=0):
  a = rng(seed).standard_normal((n, k, k))
  return (a + np.swapaxes(a, -1, -2)).astype(np.float32)


def _the_callback(text):
  calls = _hlo.custom_calls(text, CPU_CALLBACK)
  assert len(calls) == 1, text
  return calls[0]


def _eigvalsh(rec, n, k=4):
  return lambda x: bp.pure_callback(rec, S((n, k), np.float32), x, num_batch_dims=1,
                                    with_index=True)


@pytest.mark.timeout(120)
def test_batch_sharded_one_block_per_device_no_collectives(partitioner, mesh8):
  x = _sym(16)
  rec = Recorder(np.linalg.eigvalsh)
  f = _eigvalsh(rec, 16)
  xs = put(x, mesh8, P("x"))
  text = compiled_text(f, xs)
  assert collective_kinds(text) == set()
  # The block vector (offsets, local batch shape), then the local block.
  assert local_shapes(_the_callback(text)) == [(2,), (2, 4, 4)]
  y = jax.jit(f)(xs)
  assert y.sharding.spec == P("x")
  np.testing.assert_allclose(y, np.linalg.eigvalsh(x), rtol=1e-4, atol=1e-4)
  assert sorted(i[0].start for _, i in rec.calls) == list(range(0, 16, 2))
  assert all(shapes == [(2, 4, 4)] for shapes, _ in rec.calls)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["pure", "io"])
def test_uneven_batch_never_passes_padding(partitioner, mesh8, kind):
  x = _sym(13, seed=1)
  rec = Recorder(np.linalg.eigvalsh)
  call = bp.pure_callback if kind == "pure" else bp.io_callback
  sharding = NamedSharding(mesh8, P("x"))

  def f(x):
    x = jax.lax.with_sharding_constraint(x, sharding)
    return call(rec, S((13, 4), np.float32), x, num_batch_dims=1, with_index=True)

  y = jax.jit(f)(x)
  np.testing.assert_allclose(y, np.linalg.eigvalsh(x), rtol=1e-4, atol=1e-4)
  assert rec.rows() == list(range(13))
  assert len(rec.calls) == 7   # 2 rows on each of 6 devices, 1 on the 7th, none on the 8th
  assert sorted(s[0][0] for s, _ in rec.calls) == [1] + [2] * 6


def _assert_eight_blocks_of_two_rows(kind, xs):
  """eigvalsh of 16 matrices through the callback ``kind``: 8 calls of 2
  rows each, every row once, values right."""
  rec = Recorder(np.linalg.eigvalsh)
  call = bp.pure_callback if kind == "pure" else bp.io_callback
  f = lambda x: call(rec, S((16, 4), np.float32), x, num_batch_dims=1,  # noqa: E731
                     with_index=True)
  text = compiled_text(f, xs)
  assert local_shapes(_the_callback(text)) == [(2,), (2, 4, 4)]
  y = jax.jit(f)(xs)
  np.testing.assert_allclose(y, np.linalg.eigvalsh(np.asarray(xs)), rtol=1e-4, atol=1e-4)
  assert rec.rows() == list(range(16)) and len(rec.calls) == 8


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["pure", "io"])
def test_replicated_batch_is_split_not_computed_eight_times(partitioner, mesh8, kind):
  _assert_eight_blocks_of_two_rows(kind, put(_sym(16, seed=2), mesh8, P()))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["pure", "io"])
def test_mesh_2x4_batch_over_one_axis_each_element_once(partitioner, mesh2x4, kind):
  """The batch is sharded over 'b' only: the plan would replicate each block
  over 'a'; the callback splits it instead, so 8 calls of 2 rows."""
  _assert_eight_blocks_of_two_rows(kind, put(_sym(16, seed=3), mesh2x4, P("b")))


@pytest.mark.timeout(120)
def test_mesh_2x4_batch_over_both_axes(partitioner, mesh2x4):
  x = rng(4).standard_normal((2, 8, 3)).astype(np.float32)
  rec = Recorder(lambda x: x.sum(-1))
  f = lambda x: bp.pure_callback(rec, S((2, 8), np.float32), x,  # noqa: E731
                                 num_batch_dims=2, with_index=True)
  xs = put(x, mesh2x4, P("a", "b"))
  text = compiled_text(f, xs)
  assert collective_kinds(text) == set()
  assert local_shapes(_the_callback(text)) == [(4,), (1, 2, 3)]
  np.testing.assert_allclose(jax.jit(f)(xs), x.sum(-1), rtol=1e-5)
  blocks = sorted((i[0].start, i[1].start) for _, i in rec.calls)
  assert blocks == [(a, b) for a in range(2) for b in range(0, 8, 2)]


@pytest.mark.timeout(120)
def test_core_sharded_input_moves_to_batch(partitioner, mesh8):
  x = rng(5).standard_normal((16, 8)).astype(np.float32)
  rec = Recorder(lambda x: np.cumsum(x, -1))
  f = lambda x: bp.pure_callback(rec, S((16, 8), np.float32), x,  # noqa: E731
                                 num_batch_dims=1, with_index=True)
  xs = put(x, mesh8, P(None, "x"))
  text = compiled_text(f, xs)
  assert local_shapes(_the_callback(text)) == [(2,), (2, 8)]
  assert "all-gather" not in collective_kinds(text)
  np.testing.assert_allclose(jax.jit(f)(xs), np.cumsum(x, -1), rtol=1e-5, atol=1e-5)
  assert rec.rows() == list(range(16))


@pytest.mark.timeout(120)
def test_shared_operand_whole_on_every_device(partitioner, mesh8):
  a = rng(6).standard_normal((16, 3)).astype(np.float32)
  m = rng(7).standard_normal((3, 5)).astype(np.float32)
  rec = Recorder(lambda a, m: a @ m)
  f = lambda a, m: bp.pure_callback(rec, S((16, 5), np.float32), a, m,  # noqa: E731
                                    signature="(k),(k,j)->(j)", with_index=True)
  args = put(a, mesh8, P("x")), put(m, mesh8, P())
  text = compiled_text(f, *args)
  assert collective_kinds(text) == set()
  assert local_shapes(_the_callback(text)) == [(2,), (2, 3), (3, 5)]
  np.testing.assert_allclose(jax.jit(f)(*args), a @ m, rtol=1e-5, atol=1e-5)


@pytest.mark.timeout(120)
def test_explicit_mode_results_keep_the_batch_sharding(partitioner):
  mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Explicit,))
  x = _sym(16, seed=8)
  rec = Recorder(np.linalg.eigvalsh)
  f = _eigvalsh(rec, 16)
  with jax.set_mesh(mesh):
    xs = put(x, mesh, P("x"))
    y = jax.jit(f)(xs)
    assert jax.typeof(y).sharding.spec == P("x", None)
    text = compiled_text(f, xs)
  assert collective_kinds(text) == set()
  np.testing.assert_allclose(y, np.linalg.eigvalsh(x), rtol=1e-4, atol=1e-4)


@pytest.mark.timeout(120)
def test_inside_shard_map_the_local_block(partitioner, mesh8):
  x = _sym(16, seed=9)
  rec = Recorder(np.linalg.eigvalsh)
  f = jax.shard_map(lambda x: bp.pure_callback(rec, S((2, 4), np.float32), x,
                                               num_batch_dims=1, with_index=True),
                    mesh=mesh8, in_specs=P("x"), out_specs=P("x"))
  xs = put(x, mesh8, P("x"))
  text = compiled_text(f, xs)
  assert collective_kinds(text) == set()
  # Fully manual: jax's target is called directly, with the local block.
  assert local_shapes(_the_callback(text)) == [(2,), (2, 4, 4)]
  np.testing.assert_allclose(jax.jit(f)(xs), np.linalg.eigvalsh(x), rtol=1e-4, atol=1e-4)
  # The index is the block's place in what shard_map hands the function.
  assert all(i == (slice(0, 2),) for _, i in rec.calls) and len(rec.calls) == 8


@pytest.mark.timeout(120)
def test_vmap_under_jit_one_call_per_device(partitioner, mesh8):
  x = rng(10).standard_normal((8, 4, 3)).astype(np.float32)
  v = rng(11).standard_normal((3,)).astype(np.float32)
  rec = Recorder(lambda x, v: x @ v)

  def f(x, v):
    return bp.pure_callback(rec, S(x.shape[:-1], x.dtype), x, v, signature="(n),(n)->()",
                            with_index=True)

  g = jax.vmap(f, in_axes=(0, None))
  args = put(x, mesh8, P("x")), put(v, mesh8, P())
  assert collective_kinds(compiled_text(g, *args)) == set()
  np.testing.assert_allclose(jax.jit(g)(*args), x @ v, rtol=1e-5, atol=1e-5)
  assert len(rec.calls) == 8 and all(s == [(1, 4, 3), (3,)] for s, _ in rec.calls)


@pytest.mark.timeout(120)
def test_io_callback_without_results_each_row_once(partitioner, mesh2x4):
  seen, lock = [], threading.Lock()

  def write(x, index):
    with lock:
      seen.extend(range(index[0].start, index[0].stop))
    return ()

  @jax.jit
  def f(x):
    bp.io_callback(write, (), x, num_batch_dims=1, with_index=True)
    return x * 2

  x = np.arange(24, dtype=np.float32).reshape(12, 2)
  np.testing.assert_array_equal(f(put(x, mesh2x4, P("a"))), x * 2)
  assert sorted(seen) == list(range(12))


@pytest.mark.timeout(120)
def test_no_batch_dims_called_once(partitioner, mesh8):
  seen = []
  f = jax.jit(lambda x: bp.io_callback(lambda x: seen.append(1) or x * 2, S((3,), np.float32),
                                       x, num_batch_dims=0))
  y = f(put(np.ones(3, np.float32), mesh8, P()))
  np.testing.assert_array_equal(y, 2)
  assert seen == [1]


@pytest.mark.timeout(120)
def test_exception_on_every_device_reaches_the_user(partitioner, mesh8):
  def broken(x):
    raise ZeroDivisionError("no")

  f = jax.jit(lambda x: jnp.sum(bp.pure_callback(broken, S((16,), np.float32), x,
                                                 num_batch_dims=1)))
  with pytest.raises(Exception, match=r"pure_callback\(.*broken\) raised ZeroDivisionError"):
    f(put(np.ones(16, np.float32), mesh8, P("x"))).block_until_ready()
  ok = jax.jit(lambda x: jnp.sum(bp.pure_callback(np.negative, S((16,), np.float32), x,
                                                  num_batch_dims=1)))
  assert float(ok(put(np.ones(16, np.float32), mesh8, P("x")))) == -16


@pytest.mark.timeout(240)
def test_callback_then_collective_in_a_loop_does_not_hang(partitioner, mesh8):
  """The callback's blocks reach NumPy straight from the host buffers (no
  device_put onto device 0, which sits in the collective)."""
  scipy_special = pytest.importorskip("scipy.special")
  n = 40_000
  x = rng(12).uniform(0.01, 0.99, n).astype(np.float32)
  xs = put(x, mesh8, P("x"))
  f = jax.jit(lambda x: jnp.sum(bp.pure_callback(
      lambda v: scipy_special.gammainccinv(np.float32(0.5), v).astype(np.float32),
      S((n,), np.float32), x, num_batch_dims=1)))
  want = scipy_special.gammainccinv(0.5, x.astype(np.float64)).sum()
  start = time.monotonic()
  for _ in range(20):
    np.testing.assert_allclose(float(f(xs)), want, rtol=1e-3)
  assert time.monotonic() - start < 120


@pytest.mark.timeout(240)
@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 20), spec=st.sampled_from([P(), P("a"), P("b"), P(("a", "b")),
                                                      P(("b", "a"))]),
       rank2=st.booleans())
def test_io_callback_passes_each_element_exactly_once(partitioner, mesh2x4, n, spec,
                                                      rank2):
  rec = Recorder(lambda x: x + 1)
  shape = (n, 3) if rank2 else (n,)
  x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
  sharding = NamedSharding(mesh2x4, spec)

  def f(x):
    x = jax.lax.with_sharding_constraint(x, sharding)
    return bp.io_callback(rec, S(shape, np.float32), x, num_batch_dims=len(shape),
                          with_index=True)

  np.testing.assert_array_equal(jax.jit(f)(x), x + 1)
  elements = sorted(e for _, index in rec.calls
                    for e in np.ndindex(*[s.stop - s.start for s in index])
                    for e in [tuple(i + s.start for i, s in zip(e, index))])
  assert elements == list(np.ndindex(*shape))


@pytest.mark.timeout(120)
def test_explain_lists_callbacks(partitioner, mesh8):
  def my_eigvalsh(x):
    return np.linalg.eigvalsh(x)

  f = jax.jit(lambda x: bp.pure_callback(my_eigvalsh, S((16, 4), np.float32), x,
                                         num_batch_dims=1))
  report = bp.explain(f, put(_sym(16), mesh8, P("x")))
  (call,) = report.calls
  assert call.callback == "batchpart.pure_callback(test_explain_lists_callbacks.<locals>." \
                          "my_eigvalsh)"
  assert call.device_operand_shapes == ((2, 4, 4),)   # the user's operand only
  assert call.collectives_before == () and call.collectives_after == ()
  assert call.replication == 1
  assert "batchpart.pure_callback(" in str(report)


@pytest.mark.timeout(120)
def test_partially_manual_shard_map_is_refused_by_name(partitioner, mesh2x4):
  def my_cb(x):
    return x

  f = jax.shard_map(lambda x: bp.io_callback(my_cb, S(x.shape, x.dtype), x, num_batch_dims=1),
                    mesh=mesh2x4, in_specs=P("a"), out_specs=P("a"), axis_names={"a"})
  with pytest.raises(NotImplementedError, match=r"io_callback\(.*my_cb\).*some mesh axes"):
    jax.jit(f).lower(put(np.ones((16, 2), np.float32), mesh2x4, P("a")))


@pytest.mark.timeout(120)
def test_io_callback_inside_cond_and_scan(partitioner, mesh2x4):
  rec = Recorder(lambda x: x * 2)
  x = np.arange(32, dtype=np.float32).reshape(16, 2)

  def in_cond(x, flag):
    return jax.lax.cond(flag, lambda x: bp.io_callback(rec, S(x.shape, x.dtype), x,
                                                       num_batch_dims=1, with_index=True),
                        lambda x: x, x)

  np.testing.assert_array_equal(jax.jit(in_cond)(put(x, mesh2x4, P("b")), True), 2 * x)
  assert rec.rows() == list(range(16))
  rec.calls.clear()
  np.testing.assert_array_equal(jax.jit(in_cond)(put(x, mesh2x4, P("b")), False), x)
  assert rec.calls == []

  def in_scan(x):
    def body(c, xi):
      return c, bp.io_callback(rec, S(xi.shape, xi.dtype), xi, num_batch_dims=1,
                               with_index=True)
    return jax.lax.scan(body, 0, x)[1]

  x3 = x.reshape(2, 8, 2)
  np.testing.assert_array_equal(jax.jit(in_scan)(put(x3, mesh2x4, P(None, "b"))), 2 * x3)
  assert rec.rows() == sorted(list(range(8)) * 2)   # each step's 8 rows once


@pytest.mark.timeout(240)
def test_callables_are_freed_with_their_programs_on_8_devices(partitioner, mesh8):
  import functools
  import gc
  import weakref
  refs = []
  xs = put(np.ones((16, 3), np.float32), mesh8, P("x"))
  for i in range(100):
    fn = functools.partial(np.add, np.float32(i))
    refs.append(weakref.ref(fn))
    kind = bp.pure_callback if i % 2 else bp.io_callback
    g = jax.jit(functools.partial(kind, fn, S((16, 3), np.float32), num_batch_dims=1))
    assert float(g(xs)[5, 0]) == 1 + i
    del fn, g
  gc.collect()
  assert sum(r() is not None for r in refs) == 0


@pytest.mark.timeout(120)
def test_eager_call_on_a_sharded_array(partitioner, mesh8):
  rec = Recorder(lambda x: x * 3)
  xs = put(np.arange(16, dtype=np.float32), mesh8, P("x"))
  y = bp.pure_callback(rec, S((16,), np.float32), xs, num_batch_dims=1, with_index=True)
  np.testing.assert_array_equal(y, 3 * np.arange(16))
  assert rec.rows() == list(range(16)) and len(rec.calls) == 8


@pytest.mark.timeout(120)
def test_batch_dims_in_the_middle_one_block_per_device(partitioner, mesh8):
  """'(a,...,n)->(...,a)' with the middle (batch) dim sharded: each device's
  callback gets its own (a, 2, n) block in the user's layout, io_callback
  sees every element once, no collectives."""
  x = rng(7).standard_normal((3, 16, 5)).astype(np.float32)

  def per_antenna_sum(x):
    return np.moveaxis(x.sum(-1), 0, -1)

  for kind in ("pure_callback", "io_callback"):
    rec = Recorder(per_antenna_sum)
    call = getattr(bp, kind)
    f = jax.jit(lambda x, call=call, rec=rec: call(
        rec, S((16, 3), np.float32), x, signature="(a,...,n)->(...,a)", with_index=True))
    xs = put(x, mesh8, P(None, "x"))
    text = f.lower(xs).compile().as_text()
    assert collective_kinds(text) == set()
    np.testing.assert_allclose(f(xs), np.moveaxis(x.sum(-1), 0, -1), rtol=1e-5)
    jax.effects_barrier()
    assert sorted(shapes[0] for shapes, _ in rec.calls) == [(3, 2, 5)] * 8
    assert rec.rows() == list(range(16))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [16, 13])
def test_arrays_jax_each_device_gets_its_block_as_a_jax_array(partitioner, mesh8, n):
  seen = []
  lock = threading.Lock()

  def fn(x, index):
    with lock:
      seen.append((isinstance(x, jax.Array), x.shape, index[0].start))
    return jnp.cos(x.at[0].set(x[0]))

  x = rng(3).standard_normal(n).astype(np.float32)
  sharding = NamedSharding(mesh8, P("x"))
  f = jax.jit(lambda x: bp.pure_callback(fn, S((n,), np.float32),
                                         jax.lax.with_sharding_constraint(x, sharding),
                                         num_batch_dims=1, with_index=True, arrays="jax"))
  np.testing.assert_allclose(f(x), np.cos(x), rtol=1e-6)
  assert all(is_jax for is_jax, _, _ in seen)
  assert sorted(start for *_, start in seen) == list(range(0, n, 2))
  assert sum(shape[0] for _, shape, _ in seen) == n   # no padding reached the callback


@pytest.mark.timeout(300)
def test_arrays_jax_then_collective_in_a_loop_does_not_hang(partitioner, mesh8):
  """Blocks of 512 KiB per device, imported as jax.Arrays and put through
  jnp and .at[] inside the callback, then a global sum: the import aliases
  host memory, so nothing waits on the thread pool the collective holds
  (a device_put copy of blocks this size stalls such a program)."""
  n = 1 << 20
  x = np.linspace(0, 1, n, dtype=np.float32)
  xs = put(x, mesh8, P("x"))

  def fn(v):
    return jnp.sin(v.at[0].set(v[0]))

  f = jax.jit(lambda x: jnp.sum(bp.pure_callback(fn, S((n,), np.float32), x,
                                                 num_batch_dims=1, arrays="jax")))
  want = np.sin(x.astype(np.float64)).sum()
  start = time.monotonic()
  for _ in range(30):
    np.testing.assert_allclose(float(f(xs)), want, rtol=1e-4)
  assert time.monotonic() - start < 240


def _twice(x):
  return np.asarray(x) * 2


@pytest.mark.timeout(180)
@pytest.mark.parametrize("kind", ["pure", "io", "buffer"])
@pytest.mark.parametrize("batch", [None, 1], ids=["no_batch_dims", "batch_of_one"])
def test_a_one_block_result_reaches_every_device(kind, batch, partitioner, mesh8):
  """A call with no batch dims (or a batch of one) runs on one device; every
  device that uses its result must see the values, not its padding."""
  x = np.arange(1, 4, dtype=np.float32).reshape((3,) if batch is None else (1, 3))
  out = S(x.shape, np.float32)
  nbd = 0 if batch is None else 1

  def write(ctx, y, x):
    np.asarray(y)[...] = _twice(np.asarray(x))

  call = {
      "pure": lambda x: bp.pure_callback(_twice, out, x, num_batch_dims=nbd),
      "io": lambda x: bp.io_callback(_twice, out, x, num_batch_dims=nbd),
      "buffer": lambda x: bp.buffer_callback(write, out, num_batch_dims=nbd)(x),
  }[kind]
  z = put(np.arange(8, dtype=np.float32), mesh8, P("x"))
  got = jax.jit(lambda x, z: z[:, None] * call(x).reshape(-1)[None, :])(x, z)
  np.testing.assert_array_equal(np.asarray(got),
                                np.arange(8.0)[:, None] * (2 * x.reshape(-1))[None, :])
