"""bp.buffer_callback on 8 simulated devices, Shardy and GSPMD: values
against NumPy and jax's buffer_callback, one call per device on its own rows
in place, no collective in the compiled program, padding of uneven shards
never passed, replicated batches split, aliases and vmap per device."""

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import buffer_callback as jax_buffer_callback
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import batchpart as bp
from batchpart import _hlo

from helpers import collective_kinds, compiled_text, local_shapes, put, rng

TARGET = "xla_buffer_python_cpu_callback"
S = jax.ShapeDtypeStruct


class Recorder:
  """A buffer callback that records each call's buffer shapes and ``index``
  (thread-safe: devices call at once), then runs ``fn(ctx, out, *args)``."""

  def __init__(self, fn):
    self.fn, self.calls, self.lock = fn, [], threading.Lock()

  def __call__(self, ctx, out, *args, index):
    with self.lock:
      self.calls.append(([tuple(a.shape) for a in (*jax.tree_util.tree_leaves(out), *args)],
                         index))
    self.fn(ctx, out, *args)

  def rows(self) -> list[int]:
    """Every batch row (first batch dim) passed, with repeats."""
    return sorted(r for _, index in self.calls for r in range(index[0].start,
                                                                  index[0].stop))

  def block_rows(self) -> list[int]:
    return sorted(index[0].stop - index[0].start for _, index in self.calls)


def _row_sums(ctx, out, x):
  np.asarray(out)[...] = np.asarray(x).sum(-1)


def _the_callback(text):
  calls = _hlo.custom_calls(text, TARGET)
  assert len(calls) == 1, text
  return calls[0]


def _row_sum_call(rec, n, **kwargs):
  return bp.buffer_callback(rec, S((n,), np.float32), num_batch_dims=1, with_index=True,
                            **kwargs)


@pytest.mark.timeout(120)
def test_batch_sharded_one_call_per_device_on_its_rows(partitioner, mesh8):
  x = rng(0).standard_normal((16, 3)).astype(np.float32)
  rec = Recorder(_row_sums)
  f = _row_sum_call(rec, 16)
  xs = put(x, mesh8, P("x"))
  text = compiled_text(f, xs)
  assert collective_kinds(text) == set()
  assert local_shapes(_the_callback(text)) == [(2,), (2, 3)]
  y = jax.jit(f)(xs)
  assert y.sharding.spec == P("x")
  np.testing.assert_allclose(y, x.sum(-1), rtol=1e-5)
  stock = jax_buffer_callback.buffer_callback(_row_sums, S((16,), np.float32))
  np.testing.assert_allclose(y, jax.jit(stock)(xs), rtol=1e-6)
  assert rec.rows() == list(range(16)) and len(rec.calls) == 8
  assert all(shapes == [(2,), (2, 3)] for shapes, _ in rec.calls)


@pytest.mark.timeout(120)
def test_stock_buffer_callback_gathers_what_batchpart_does_not(partitioner, mesh8):
  """The gain, on jax's own callback: it gathers the operand and runs on the
  whole array; batchpart's program has no collective."""
  x = put(np.ones((16, 3), np.float32), mesh8, P("x"))
  stock = jax_buffer_callback.buffer_callback(_row_sums, S((16,), np.float32))
  assert "all-gather" in collective_kinds(compiled_text(stock, x))
  assert collective_kinds(compiled_text(_row_sum_call(Recorder(_row_sums), 16), x)) == set()


@pytest.mark.timeout(120)
def test_uneven_batch_padding_never_reaches_a_side_effect(partitioner, mesh8):
  """13 rows on 8 devices: blocks of 2,2,2,2,2,2,1, the eighth device not
  called; every row written once."""
  x = rng(1).standard_normal((13, 3)).astype(np.float32)
  rec = Recorder(_row_sums)
  call = _row_sum_call(rec, 13, has_side_effect=True)
  sharding = NamedSharding(mesh8, P("x"))
  f = jax.jit(lambda x: call(jax.lax.with_sharding_constraint(x, sharding)))
  np.testing.assert_allclose(f(x), x.sum(-1), rtol=1e-5)
  assert rec.rows() == list(range(13))
  assert rec.block_rows() == [1] + [2] * 6
  assert sorted(s for shapes, _ in rec.calls for s in shapes) == (
      [(1,), (1, 3)] + [(2,)] * 6 + [(2, 3)] * 6)


@pytest.mark.timeout(120)
def test_replicated_batch_is_split_across_devices(partitioner, mesh8):
  x = rng(2).standard_normal((16, 3)).astype(np.float32)
  rec = Recorder(_row_sums)
  f = _row_sum_call(rec, 16)
  xs = put(x, mesh8, P())
  assert local_shapes(_the_callback(compiled_text(f, xs))) == [(2,), (2, 3)]
  np.testing.assert_allclose(jax.jit(f)(xs), x.sum(-1), rtol=1e-5)
  assert rec.rows() == list(range(16)) and len(rec.calls) == 8


@pytest.mark.timeout(120)
def test_mesh_2x4_batch_over_one_axis_each_row_once(partitioner, mesh2x4):
  x = rng(3).standard_normal((16, 3)).astype(np.float32)
  rec = Recorder(_row_sums)
  f = _row_sum_call(rec, 16, has_side_effect=True)
  np.testing.assert_allclose(jax.jit(f)(put(x, mesh2x4, P("b"))), x.sum(-1), rtol=1e-5)
  assert rec.rows() == list(range(16)) and len(rec.calls) == 8


@pytest.mark.timeout(120)
def test_aliases_per_device_in_place(partitioner, mesh8):
  """The result is written into the operand's buffer on every device, also
  on uneven shards."""
  shared = []

  def inc(ctx, out, x):
    shared.append(np.shares_memory(np.asarray(out), np.asarray(x)))
    np.asarray(out)[...] += 1

  def sharded_inc(n):
    call = bp.buffer_callback(inc, S((n, 3), np.float32), num_batch_dims=1,
                              input_output_aliases={0: 0})
    return lambda x: call(jax.lax.with_sharding_constraint(x, NamedSharding(mesh8, P("x"))))

  for n in (16, 13):
    shared.clear()
    x = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
    f = sharded_inc(n)
    text = compiled_text(f, x)
    assert "output_to_operand_aliasing={{}: (1, {})}" in str(_the_callback(text).text)
    np.testing.assert_array_equal(jax.jit(f)(x), x + 1)
    assert shared == [True] * (8 if n == 16 else 7)


@pytest.mark.timeout(120)
def test_vmap_under_jit_one_call_per_device(partitioner, mesh8):
  x = rng(4).standard_normal((8, 4, 3)).astype(np.float32)
  rec = Recorder(_row_sums)
  f = jax.vmap(bp.buffer_callback(rec, S((4,), np.float32), num_batch_dims=1,
                                  with_index=True))
  y = jax.jit(f)(put(x, mesh8, P("x")))
  np.testing.assert_allclose(y, x.sum(-1), rtol=1e-5)
  assert len(rec.calls) == 8
  assert all(shapes == [(1, 4), (1, 4, 3)] for shapes, _ in rec.calls)
  assert sorted(i[0].start for _, i in rec.calls) == list(range(8))


@pytest.mark.timeout(120)
def test_signature_ellipsis_per_device_in_the_user_layout(partitioner, mesh8):
  """'(a,...,n),(n)->(...,a)' with the batch sharded: each device's call
  gets (a, its rows, n) and writes (its rows, a)."""
  x = rng(5).standard_normal((3, 16, 4)).astype(np.float32)
  w = np.arange(4, dtype=np.float32)

  def project(ctx, out, x, w):
    np.asarray(out)[...] = np.moveaxis((np.asarray(x) * np.asarray(w)).sum(-1), 0, -1)

  rec = Recorder(project)
  f = bp.buffer_callback(rec, S((16, 3), np.float32), signature="(a,...,n),(n)->(...,a)",
                         with_index=True)
  y = jax.jit(f)(put(x, mesh8, P(None, "x")), w)
  np.testing.assert_allclose(y, np.moveaxis((x * w).sum(-1), 0, -1), rtol=1e-5)
  assert len(rec.calls) == 8
  assert all(shapes == [(2, 3), (3, 2, 4), (4,)] for shapes, _ in rec.calls)


@pytest.mark.timeout(120)
def test_callback_then_collective_in_a_loop_does_not_hang(partitioner, mesh8):
  x = put(rng(6).standard_normal((64, 8)).astype(np.float32), mesh8, P("x"))
  call = bp.buffer_callback(_row_sums, S((64,), np.float32), num_batch_dims=1)
  f = jax.jit(lambda x: jnp.sum(call(x)))
  want = np.asarray(x).sum()
  for _ in range(10):
    np.testing.assert_allclose(f(x), want, rtol=1e-4)


@pytest.mark.timeout(120)
def test_inside_shard_map_and_eager_and_explicit(partitioner, mesh8):
  """shard_map: each device's call gets what shard_map hands it; eager on a
  sharded array and Explicit mode: one call per device, results typed with
  the batch sharding."""
  x = rng(7).standard_normal((16, 3)).astype(np.float32)
  xs = put(x, mesh8, P("x"))
  rec = Recorder(_row_sums)
  inner = _row_sum_call(rec, 2)
  g = jax.shard_map(inner, mesh=mesh8, in_specs=P("x"), out_specs=P("x"))
  np.testing.assert_allclose(jax.jit(g)(xs), x.sum(-1), rtol=1e-5)
  assert len(rec.calls) == 8 and all(i == (slice(0, 2),) for _, i in rec.calls)
  rec.calls.clear()
  np.testing.assert_allclose(_row_sum_call(rec, 16)(xs), x.sum(-1), rtol=1e-5)
  assert rec.rows() == list(range(16)) and len(rec.calls) == 8
  rec.calls.clear()
  mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Explicit,))
  with jax.set_mesh(mesh):
    y = jax.jit(_row_sum_call(rec, 16))(put(x, mesh, P("x")))
    assert jax.typeof(y).sharding.spec == P("x")
  np.testing.assert_allclose(y, x.sum(-1), rtol=1e-5)
  assert rec.rows() == list(range(16)) and len(rec.calls) == 8


@pytest.mark.timeout(120)
def test_explain_names_the_callback_and_its_declaration(partitioner, mesh8):
  xs = put(np.ones((16, 3), np.float32), mesh8, P("x"))
  f = bp.buffer_callback(_row_sums, S((16,), np.float32), signature="(k)->()")
  call = bp.explain(jax.jit(f), xs).calls[0]
  assert call.callback == "batchpart.buffer_callback(_row_sums)"
  assert call.declaration == "signature='(k)->()'"
  assert call.device_operand_shapes == ((2, 3),)   # the block vector is not listed
  assert call.collectives_before == () and call.collectives_after == ()
  assert call.replication == 1
