"""Host callbacks with the scanned dim split on 8 devices: each device's call
gets its part of the sequence and the state the part starts in (parallel:
twice, from zero then from the folded state; sequential: once, handed part
to part), ``with_index`` says where the part lies; NumPy and scipy's
``lfilter`` against the unsharded computation, bit for bit where the
kernel is exact."""

import threading

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import batchpart as bp
import batchpart.testing as bt

from helpers import assert_one_all_gather, collective_lines, put_each

S = jax.ShapeDtypeStruct
pytestmark = pytest.mark.timeout(300)




class Recorder:
  """Each call's ``index`` and the shape of its sequence operand."""

  def __init__(self):
    self.lock = threading.Lock()
    self.calls = []

  def add(self, index, shape):
    with self.lock:
      self.calls.append((index, tuple(shape)))


def _prefix(record, reverse):
  def prefix(x, s0, index):
    record.add(index, x.shape)
    run = np.cumsum(x[..., ::-1], -1)[..., ::-1] if reverse else np.cumsum(x, -1)
    return (run + s0[..., None]).astype(x.dtype), (s0 + x.sum(-1)).astype(x.dtype)
  return prefix


def _tanh_rnn(record, reverse):
  def rnn(x, h0, index):
    record.add(index, x.shape)
    y, h = np.empty_like(x), h0.copy()
    steps = range(x.shape[-1])
    for i in (reversed(steps) if reverse else steps):
      h = np.tanh(np.float32(0.9) * h + x[..., i])
      y[..., i] = h
    return y, h
  return rnn


@pytest.mark.parametrize("reverse", [False, True])
def test_parallel_prefix_sum_each_device_its_part_twice(partitioner, mesh8, reverse):
  rng = np.random.default_rng(0)
  x = rng.integers(-2**30, 2**30, (4, 64)).astype(np.int32)
  s0 = rng.integers(-2**30, 2**30, (4,)).astype(np.int32)
  record = Recorder()
  fn = jax.jit(lambda x, s0: bp.pure_callback(
      _prefix(record, reverse), (S(x.shape, x.dtype), S(s0.shape, s0.dtype)), x, s0,
      signature="(t),()->(t),()", with_index=True,
      scan={"t": bp.Scan((1, 1), merge=bt.add_merge, reverse=reverse)}))
  args = put_each(mesh8, [(x, P(None, "x")), (s0, P())])
  y, sf = fn(*args)
  with np.errstate(over="ignore"):
    run = np.cumsum(x[:, ::-1], -1)[:, ::-1] if reverse else np.cumsum(x, -1)
    np.testing.assert_array_equal(np.asarray(y), (run + s0[:, None]).astype(np.int32))
    np.testing.assert_array_equal(np.asarray(sf), (s0 + x.sum(-1)).astype(np.int32))
  assert y.sharding.spec == P(None, "x")
  # Two passes on each of the 8 parts, each of 8 steps, located by index.
  assert len(record.calls) == 16
  parts = sorted({(i[1].start, i[1].stop) for i, _ in record.calls})
  assert parts == [(8 * p, 8 * p + 8) for p in range(8)]
  assert all(i[0] == slice(0, 4) and shape == (4, 8) for i, shape in record.calls)
  assert_one_all_gather(fn.lower(*args).compile().as_text(), "[8,4]")


@pytest.mark.parametrize("reverse", [False, True])
def test_sequential_rnn_handed_part_to_part_bit_for_bit(partitioner, mesh2x4, reverse):
  rng = np.random.default_rng(1)
  x = rng.normal(size=(4, 40)).astype(np.float32)
  h0 = rng.normal(size=(4,)).astype(np.float32)
  record = Recorder()
  rnn = _tanh_rnn(record, reverse)
  fn = jax.jit(lambda x, h0: bp.pure_callback(
      rnn, (S(x.shape, x.dtype), S(h0.shape, h0.dtype)), x, h0,
      signature="(t),()->(t),()", with_index=True,
      scan={"t": bp.Scan((1, 1), reverse=reverse)}))
  args = put_each(mesh2x4, [(x, P("a", "b")), (h0, P("a"))])
  y, hf = fn(*args)
  want = _tanh_rnn(Recorder(), reverse)(x, h0, index=None)
  # The same steps in the same order as one call on the whole sequence.
  np.testing.assert_array_equal(np.asarray(y), want[0])
  np.testing.assert_array_equal(np.asarray(hf), want[1])
  calls = record.calls
  assert len(calls) == 8 and all(shape == (2, 10) for _, shape in calls)
  assert sorted({(i[0].start, i[1].start) for i, _ in calls}) == [
      (b, t) for b in (0, 2) for t in (0, 10, 20, 30)]
  text = fn.lower(*args).compile().as_text()
  permutes = collective_lines(text, "collective-permute")
  assert len(permutes) == 3 and all("[2]" in p for p in permutes), permutes
  assert not [g for g in collective_lines(text, "all-gather") if "40]" in g or "10]" in g]


def _lfilter(signal, b, a):
  def lfilter(x, zi):
    y, zf = signal.lfilter(b, a, np.asarray(x), axis=-1, zi=np.asarray(zi))
    return y.astype(x.dtype), zf.astype(zi.dtype)
  return lfilter


@pytest.mark.parametrize("x_spec, zi_spec", [(P("a", "b"), P("a")),
                                             (P(("a", "b"), None), P(("a", "b")))],
                         ids=["t split", "rows split, t whole"])
def test_lfilter_sequential_bit_for_bit(partitioner, mesh2x4, x_spec, zi_spec):
  """scipy's lfilter with its initial conditions, each call from the state
  its part starts in (with t whole: the initial state itself)."""
  signal = pytest.importorskip("scipy.signal")
  b, a = signal.butter(3, 0.2)
  rng = np.random.default_rng(2)
  x = rng.standard_normal((8, 96))
  zi = rng.standard_normal((8, 3))
  with jax.enable_x64(True):
    fn = jax.jit(lambda x, zi: bp.pure_callback(
        _lfilter(signal, b, a), (S(x.shape, x.dtype), S(zi.shape, zi.dtype)), x, zi,
        signature="(t),(z)->(t),(z)", scan={"t": bp.Scan((1, 1))}))
    y, zf = fn(*put_each(mesh2x4, [(x, x_spec), (zi, zi_spec)]))
  want = signal.lfilter(b, a, x, axis=-1, zi=zi)
  np.testing.assert_array_equal(np.asarray(y), want[0])
  np.testing.assert_array_equal(np.asarray(zf), want[1])


def _first_order(state, summary):
  """A first-order filter's state after a stretch: decay * state + zf."""
  zf, decay = summary
  return decay * state + zf


def _compose(p, q):
  (z1, d1), (z2, d2) = p, q
  return d2 * z1 + z2, d1 * d2


def test_lfilter_parallel_first_order_with_a_merge(partitioner, mesh8):
  """A linear filter composes: its summary is (zf from zero, the decay of the
  stretch), the state after it ``decay * state + zf``."""
  signal = pytest.importorskip("scipy.signal")
  b, a = [0.2, 0.3], [1.0, -0.9]
  rng = np.random.default_rng(3)
  x = rng.standard_normal((2, 128))
  zi = rng.standard_normal((2, 1))

  def lfilter(x, zi):
    y, zf = signal.lfilter(b, a, x, axis=-1, zi=zi)
    decay = np.full(zi.shape, 0.9 ** x.shape[-1])
    return y, zf, decay

  scan = bp.Scan((1, 1), merge=_compose, apply=lambda s, z: _first_order(z, s))
  with jax.enable_x64(True):
    fn = jax.jit(lambda x, zi: bp.pure_callback(
        lfilter, (S(x.shape, x.dtype), S(zi.shape, zi.dtype), S(zi.shape, zi.dtype)),
        x, zi, signature="(t),(z)->(t),(z),(z)", scan={"t": scan}, arrays="numpy"))
    y, zf, decay = fn(*put_each(mesh8, [(x, P(None, "x")), (zi, P())]))
  want = signal.lfilter(b, a, x, axis=-1, zi=zi)
  # The fold reassociates the filter across 8 parts: a few ulps.
  np.testing.assert_allclose(np.asarray(y), want[0], rtol=1e-12, atol=1e-12)
  np.testing.assert_allclose(np.asarray(zf), want[1], rtol=1e-12, atol=1e-12)
  np.testing.assert_allclose(np.asarray(decay), np.full(zi.shape, 0.9 ** 128), rtol=1e-12)


def test_partition_callback_splits_a_jax_pure_callback(partitioner, mesh2x4):
  signal = pytest.importorskip("scipy.signal")
  b, a = signal.butter(2, 0.3)
  lfilter = _lfilter(signal, b, a)
  # NumPy arrays: jax arrays made on the callback's thread would not see the
  # x64 context this test enables on its own thread.
  bp.partition_callback(lfilter, signature="(t),(z)->(t),(z)", scan={"t": bp.Scan((1, 1))},
                        arrays="numpy")
  try:
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 64))
    zi = rng.standard_normal((2, 2))
    with jax.enable_x64(True):
      fn = jax.jit(lambda x, zi: jax.pure_callback(
          lfilter, (S(x.shape, x.dtype), S(zi.shape, zi.dtype)), x, zi))
      args = put_each(mesh2x4, [(x, P("a", "b")), (zi, P("a"))])
      y, zf = fn(*args)
      text = fn.lower(*args).compile().as_text()
    want = signal.lfilter(b, a, x, axis=-1, zi=zi)
    np.testing.assert_array_equal(np.asarray(y), want[0])
    np.testing.assert_array_equal(np.asarray(zf), want[1])
    assert len(collective_lines(text, "collective-permute")) == 3
  finally:
    bp.unpartition(lfilter)


def test_io_callback_sequential_scan_calls_each_part_once(partitioner, mesh8):
  x = np.arange(32, dtype=np.int32).reshape(1, 32)
  s0 = np.array([7], np.int32)
  record = Recorder()
  fn = jax.jit(lambda x, s0: bp.io_callback(
      _prefix(record, False), (S(x.shape, x.dtype), S(s0.shape, s0.dtype)), x, s0,
      signature="(t),()->(t),()", with_index=True, scan={"t": bp.Scan((1, 1))}))
  y, sf = fn(*put_each(mesh8, [(x, P(None, "x")), (s0, P())]))
  np.testing.assert_array_equal(np.asarray(y), np.cumsum(x, -1) + 7)
  np.testing.assert_array_equal(np.asarray(sf), x.sum(-1) + 7)
  assert sorted(i[1].start for i, _ in record.calls) == list(range(0, 32, 4))


def test_partition_callback_refuses_a_parallel_io_callback(mesh8):
  def effect(x, s0):
    return x, s0

  bp.partition_callback(effect, signature="(t),()->(t),()",
                        scan={"t": bp.Scan((1, 1), merge=bt.add_merge)})
  try:
    fn = jax.jit(lambda x, s: jax.experimental.io_callback(
        effect, (S((8,), np.float32), S((), np.float32)), x, s))
    with pytest.raises(ValueError, match=r"partition_callback\(.*effect\): scan=.*'t'.*has a "
                                         r"merge; this is a jax io_callback"):
      fn.lower(np.zeros(8, np.float32), np.float32(0))
  finally:
    bp.unpartition(effect)
