"""Scanned dims on 8 devices: the linear recurrence, prefix sums and a
nonlinear RNN with the sequence split, against NumPy; integer kernels bit
for bit, floats within the reassociation of the fold; the compiled program
has one all-gather of summary-sized arrays (parallel) or collective-permutes
of the state (sequential), never a gather of the sequence."""

import re

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import batchpart as bp
import batchpart.testing as bt
from batchpart._hlo import custom_calls
from batchpart._partition import scan

from helpers import assert_one_all_gather, collective_lines, flat, put_each

S = jax.ShapeDtypeStruct
pytestmark = pytest.mark.timeout(300)


def linear_ref(a, x, h0, reverse=False):
  y = np.zeros_like(x)
  h, p = h0.copy(), np.ones_like(h0)
  steps = range(x.shape[-1])
  with np.errstate(over="ignore"):
    for i in (reversed(steps) if reverse else steps):
      h = a[..., i] * h + x[..., i]
      p = p * a[..., i]
      y[..., i] = h
  return y, h, p


def prefix_ref(x, s0, reverse=False):
  y = np.cumsum(x[..., ::-1], -1)[..., ::-1] if reverse else np.cumsum(x, -1)
  y = (y + s0[..., None]).astype(x.dtype)
  return y, (s0 + x.sum(-1)).astype(x.dtype)


def tanh_ref(x, h0, w, reverse=False):
  y = np.zeros_like(x)
  h = h0.copy()
  steps = range(x.shape[-1])
  for i in (reversed(steps) if reverse else steps):
    h = np.tanh(w * h + x[..., i]).astype(x.dtype)
    y[..., i] = h
  return y, h


def prefix_sum(shape, dtype, reverse=False, parallel=True):
  scan = bp.Scan((1, 1), merge=bt.add_merge if parallel else None, reverse=reverse)
  state = S(tuple(shape[:-1]), dtype)
  return bp.ffi_call("batchpart_test_prefix_sum", (S(tuple(shape), dtype), state),
                     signature="(t),()->(t),()", scan={"t": scan})


def tanh_rnn(shape, dtype, reverse=False):
  state = S(tuple(shape[:-1]), dtype)
  return bp.ffi_call("batchpart_test_tanh_rnn", (S(tuple(shape), dtype), state),
                     signature="(t),()->(t),()",
                     scan={"t": bp.Scan((1, 1), reverse=reverse)})



def _hlo(fn, *args) -> str:
  return fn.lower(*args).compile().as_text()



def _linear_data(shape, dtype, seed=0):
  rng = np.random.default_rng(seed)
  if np.issubdtype(dtype, np.integer):
    a = rng.integers(-3, 4, shape).astype(dtype)
    x = rng.integers(-1000, 1000, shape).astype(dtype)
    h0 = rng.integers(-1000, 1000, shape[:-1]).astype(dtype)
  else:
    a = rng.uniform(0.8, 1.0, shape).astype(dtype)
    x = rng.normal(size=shape).astype(dtype)
    h0 = rng.normal(size=shape[:-1]).astype(dtype)
  return a, x, h0


def _check(got, want, dtype):
  for g, w in zip(got, want):
    if np.issubdtype(dtype, np.integer):
      np.testing.assert_array_equal(np.asarray(g), w)
    else:
      # The fold reassociates the recurrence: a few ulps per step of the fold.
      tol = 2e-5 if dtype == np.float32 else 1e-12
      np.testing.assert_allclose(np.asarray(g), w, rtol=tol, atol=tol)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
def test_linear_recurrence_two_passes(partitioner, mesh8, reverse, dtype):
  with jax.enable_x64(dtype == np.float64):
    shape = (4, 64)
    a, x, h0 = _linear_data(shape, dtype)
    f = bt.linear_scan(shape, dtype, reverse=reverse)
    fn = jax.jit(lambda a, x, h0: f(a, x, h0, reverse=np.int64(reverse)))
    args = put_each(mesh8, [(a, P(None, "x")), (x, P(None, "x")), (h0, P())])
    out = fn(*args)
    _check(out, linear_ref(a, x, h0, reverse), dtype)
    assert out[0].sharding.spec == P(None, "x")
    text = _hlo(fn, *args)
    gathers = collective_lines(text, "all-gather")
    assert len(gathers) == 1, gathers
    # The summaries: (h_T, prod a) of every part, 8 x 4 elements each.
    assert re.search(r"\[8,4\]", gathers[0]), gathers[0]
    assert "[4,64]" not in gathers[0]
    assert len(re.findall(r'custom_call_target="batchpart_test_linear_scan"', text)) == 2


@pytest.mark.parametrize("reverse", [False, True])
def test_integer_prefix_sum_bit_for_bit_with_batch_dims_sharded(partitioner, mesh2x4,
                                                                 reverse):
  rng = np.random.default_rng(1)
  x = rng.integers(-2**30, 2**30, (6, 32)).astype(np.int32)
  s0 = rng.integers(-2**30, 2**30, (6,)).astype(np.int32)
  f = prefix_sum(x.shape, np.int32, reverse)
  fn = jax.jit(lambda x, s0: f(x, s0, reverse=np.int64(reverse)))
  args = put_each(mesh2x4, [(x, P("a", "b")), (s0, P("a"))])
  with np.errstate(over="ignore"):
    _check(fn(*args), prefix_ref(x, s0, reverse), np.int32)
  assert_one_all_gather(_hlo(fn, *args), "[4,3]")


@pytest.mark.parametrize("reverse", [False, True])
# Each case its own batch size: the partitioner's and jax's caches key on
# the program, not on the pipeline's threshold.
@pytest.mark.parametrize("batch, chunks, min_chunk", [(3, 3, 1), (16, 8, 1), (1, 1, 1),
                                                      (12, 4, 15), (5, 1, None)])
def test_sequential_scan_hands_the_state_on(partitioner, mesh8, monkeypatch, reverse, batch,
                                            chunks, min_chunk):
  """The state goes part to part, pipelined over chunks of the batch where
  each holds enough work (``min_chunk`` elements per step-result here; None:
  the default, which these short parts do not reach): stage s runs chunk
  s - q on the devices at position q of the flow, so 8 + chunks - 1 stages
  each hand a chunk's state on (one stage of the whole batch each where it
  is not cut)."""
  if min_chunk is not None:
    monkeypatch.setattr(scan, "MIN_CHUNK_ELEMENTS", min_chunk)
  rng = np.random.default_rng(2)
  x = rng.normal(size=(batch, 40)).astype(np.float32)
  h0 = rng.normal(size=(batch,)).astype(np.float32)
  f = tanh_rnn(x.shape, np.float32, reverse)
  fn = jax.jit(lambda x, h0: f(x, h0, w=0.9, reverse=np.int64(reverse)))
  args = put_each(mesh8, [(x, P(None, "x")), (h0, P())])
  out = fn(*args)
  # Each chunk of each part runs from the exact state the previous part
  # ended it in: the same operations in the same order as one call on the
  # whole sequence, so bit for bit.
  whole = jax.jit(lambda x, h0: f(x, h0, w=0.9, reverse=np.int64(reverse)))(x, h0)
  for got, want in zip(out, whole):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  want = tanh_ref(x, h0, np.float32(0.9), reverse)
  np.testing.assert_allclose(np.asarray(out[0]), want[0], rtol=1e-6, atol=1e-6)
  text = _hlo(fn, *args)
  permutes = collective_lines(text, "collective-permute")
  assert len(permutes) == 8 + chunks - 2, permutes
  assert all(f"[{batch // chunks}]" in p for p in permutes)
  calls = custom_calls(text, "batchpart_test_tanh_rnn")
  assert {c.operand_types[0].shape for c in calls} == {(batch // chunks, 5)}
  gathers = collective_lines(text, "all-gather")
  assert all(f"[{batch},40]" not in g and f"[{batch},5]" not in g for g in gathers), gathers


def test_sequential_integer_prefix_sum_bit_for_bit(partitioner, mesh2x4):
  rng = np.random.default_rng(3)
  x = rng.integers(-2**30, 2**30, (4, 16)).astype(np.int32)
  s0 = rng.integers(-2**30, 2**30, (4,)).astype(np.int32)
  f = prefix_sum(x.shape, np.int32, parallel=False)
  fn = jax.jit(lambda x, s0: f(x, s0, reverse=np.int64(0)))
  args = put_each(mesh2x4, [(x, P("a", "b")), (s0, P("a"))])
  with np.errstate(over="ignore"):
    _check(fn(*args), prefix_ref(x, s0), np.int32)


def test_uneven_split_keeps_the_dim_whole(partitioner, mesh8):
  a, x, h0 = _linear_data((2, 20), np.float32)
  f = bt.linear_scan((2, 20), np.float32)
  split = NamedSharding(mesh8, P(None, "x"))
  fn = jax.jit(lambda a, x, h0: f(jax.lax.with_sharding_constraint(a, split),
                                  jax.lax.with_sharding_constraint(x, split), h0,
                                  reverse=np.int64(0)))
  _check(fn(a, x, h0), linear_ref(a, x, h0), np.float32)


def test_in_a_fori_loop_and_under_vmap(partitioner, mesh8):
  a, x, h0 = _linear_data((2, 32), np.float32)
  f = bt.linear_scan((2, 32), np.float32)

  def loop(a, x, h):
    return jax.lax.fori_loop(0, 3, lambda _, h: f(a, x, h, reverse=np.int64(0))[1], h)

  got = jax.jit(loop)(*put_each(mesh8, [(a, P(None, "x")), (x, P(None, "x")), (h0, P())]))
  h = h0
  for _ in range(3):
    h = linear_ref(a, x, h)[1]
  np.testing.assert_allclose(np.asarray(got), h, rtol=1e-4, atol=1e-4)
  stacked = np.stack([a, a])
  vm = jax.jit(jax.vmap(lambda a, x, h: f(a, x, h, reverse=np.int64(0))))
  args = put_each(mesh8, [(stacked, P(None, None, "x")), (np.stack([x, x]), P(None, None, "x")),
                      (np.stack([h0, h0]), P())])
  out = vm(*args)
  _check([o[1] for o in out], linear_ref(a, x, h0), np.float32)


def test_partition_ffi_target_with_a_scan(partitioner, mesh8):
  target = "batchpart_test_prefix_sum"
  bp.partition_ffi_target(target, signature="(t),()->(t),()",
                          scan={"t": bp.Scan((1, 1), merge=bt.add_merge)})
  try:
    x = np.arange(64, dtype=np.int32).reshape(2, 32)
    s0 = np.array([5, -5], np.int32)
    fn = jax.jit(lambda x, s0: jax.ffi.ffi_call(
        target, (S(x.shape, x.dtype), S(s0.shape, s0.dtype)))(x, s0, reverse=np.int64(0)))
    args = put_each(mesh8, [(x, P(None, "x")), (s0, P())])
    _check(fn(*args), prefix_ref(x, s0), np.int32)
    assert len(collective_lines(_hlo(fn, *args), "all-gather")) == 1
  finally:
    bp.unpartition(target)


def test_io_callback_refuses_a_parallel_scan():
  with pytest.raises(ValueError, match=r"batchpart\.io_callback\(.*\): scan=.*'t'.*has a "
                                       r"merge"):
    bp.io_callback(lambda x, s: (x, s), (S((4,), np.float32), S((), np.float32)),
                   np.zeros(4, np.float32), np.float32(0), signature="(t),()->(t),()",
                   scan={"t": bp.Scan((1, 1), merge=bt.add_merge)})
  with pytest.raises(ValueError, match=r"batchpart\.pure_callback\(.*\): scan names the "
                                       r"dim 't', which is a dim of the state operand 0"):
    bp.pure_callback(lambda x, s: (x, s), (S((4,), np.float32), S((), np.float32)),
                     np.zeros(4, np.float32), np.float32(0), signature="(t),()->(t),()",
                     scan={"t": bp.Scan((0, 1))})


def test_explain_names_the_scan_its_passes_and_bytes(partitioner, mesh8):
  a, x, h0 = _linear_data((4, 64), np.float32)
  f = bt.linear_scan((4, 64), np.float32)
  args = put_each(mesh8, [(a, P(None, "x")), (x, P(None, "x")), (h0, P())])
  report = bp.explain(lambda a, x, h: f(a, x, h, reverse=np.int64(0)), *args)
  scanned = [c for c in report.calls if c.scan_dims]
  assert len(scanned) == 2   # the two passes
  t = scanned[0].scan_dims[0]
  assert (t.name, t.parallel, t.size, t.parts) == ("t", True, 64, 8)
  assert t.moved_bytes == 2 * 8 * 4 * 4   # (h_T, prod a) of 8 parts, 4 elements each
  assert scanned[0].replication == 1
  assert "scan:        t (size 64)" in str(report) and "parallel" in str(report)
  g = tanh_rnn((3, 40), np.float32)
  report = bp.explain(lambda x, h: g(x, h, w=0.5, reverse=np.int64(0)),
                      *put_each(mesh8, [(x[:3, :40], P(None, "x")), (h0[:3], P())]))
  assert "sequential: the state handed part to part" in flat(str(report))
  # 7 hand-offs of the (3,) state and one all-gather of the 8 parts' final states.
  (seq,) = {c.scan_dims[0] for c in report.calls if c.scan_dims}
  assert (seq.parallel, seq.parts, seq.moved_bytes) == (False, 8, 7 * 3 * 4 + 8 * 3 * 4)
