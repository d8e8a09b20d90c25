"""``bp.batch_partitionable(scan=...)``: a wrapper around a stock
``jax.ffi.ffi_call`` whose sequence dim is followed through the wrapper and
declared scanned on the call, on 8 devices against NumPy."""

import re
import warnings

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import batchpart as bp
import batchpart.testing as bt

from helpers import put_each

S = jax.ShapeDtypeStruct
pytestmark = pytest.mark.timeout(300)



def _linear_ref(a, x, h0):
  y, h = np.zeros_like(x), h0.copy()
  for i in range(x.shape[-1]):
    h = a[..., i] * h + x[..., i]
    y[..., i] = h
  return y, h


def _gathers(text):
  return [line for line in text.splitlines() if re.search(r"\ball-gather(-start)?\(", line)]


LINEAR = bp.Scan(state=(2, 1), merge=bt.linear_merge, apply=bt.linear_apply)


@bp.batch_partitionable(signature="(t),(t),()->(t),()", scan={"t": LINEAR})
def recurrence(a, x, h0):
  """The FFI tutorial's pattern: a stock ffi_call, one result dropped and one
  scaled on the way out."""
  state = S(h0.shape, h0.dtype)
  y, h, _ = jax.ffi.ffi_call("batchpart_test_linear_scan", (S(x.shape, x.dtype), state, state))(
      a, x, h0, reverse=np.int64(0))
  return y * 1.0, h


def test_wrapper_scan_splits_the_call(partitioner, mesh2x4):
  rng = np.random.default_rng(0)
  a = rng.uniform(0.8, 1.0, (4, 64)).astype(np.float32)
  x = rng.normal(size=(4, 64)).astype(np.float32)
  h0 = rng.normal(size=(4,)).astype(np.float32)
  args = put_each(mesh2x4, [(a, P("a", "b")), (x, P("a", "b")), (h0, P("a"))])
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    fn = jax.jit(recurrence)
    y, h = fn(*args)
  want = _linear_ref(a, x, h0)
  np.testing.assert_allclose(np.asarray(y), want[0], rtol=2e-5, atol=2e-5)
  np.testing.assert_allclose(np.asarray(h), want[1], rtol=2e-5, atol=2e-5)
  text = fn.lower(*args).compile().as_text()
  gathers = _gathers(text)
  assert len(gathers) == 1 and "[4,2]" in gathers[0], gathers   # 4 parts' (h_T, prod a)
  assert len(re.findall(r'custom_call_target="batchpart_test_linear_scan"', text)) == 2


@bp.batch_partitionable(signature="(t),()->(t),()", scan={"t": bp.Scan(state=(1, 1))})
def rnn(x, h0):
  state = S(h0.shape, h0.dtype)
  return jax.ffi.ffi_call("batchpart_test_tanh_rnn", (S(x.shape, x.dtype), state))(
      x, h0, w=0.5, reverse=np.int64(0))


def test_wrapper_sequential_scan_hands_the_state_on(partitioner, mesh8):
  rng = np.random.default_rng(1)
  x = rng.normal(size=(2, 32)).astype(np.float32)
  h0 = rng.normal(size=(2,)).astype(np.float32)
  args = put_each(mesh8, [(x, P(None, "x")), (h0, P())])
  fn = jax.jit(rnn)
  y, h = fn(*args)
  want_h, want_y = h0.copy(), np.zeros_like(x)
  for i in range(32):
    want_h = np.tanh(np.float32(0.5) * want_h + x[:, i])
    want_y[:, i] = want_h
  np.testing.assert_allclose(np.asarray(y), want_y, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(np.asarray(h), want_h, rtol=1e-6, atol=1e-6)
  assert "collective-permute" in fn.lower(*args).compile().as_text()


def test_wrapper_scan_with_no_clear_state_warns(mesh8):
  """The call takes the state first and returns two state-shaped results:
  which one is the final state cannot be told (lowered only)."""
  bad = bp.batch_partitionable(
      lambda x, h0: jax.ffi.ffi_call("batchpart_test_tanh_rnn", (
          S(x.shape, x.dtype), S(h0.shape, h0.dtype), S(h0.shape, h0.dtype)))(
          h0, x, w=0.5, reverse=np.int64(0))[:2],
      signature="(t),()->(t),()", scan={"t": bp.Scan(state=(1, 1))})
  x = np.zeros((2, 16), np.float32)
  h0 = np.zeros((2,), np.float32)
  with pytest.warns(UserWarning, match=r"batch_partitionable\(.*\).*'batchpart_test_tanh_rnn'"
                                       r".*scanned dim 't'"):
    jax.jit(bad).lower(*put_each(mesh8, [(x, P(None, "x")), (h0, P())]))


def test_wrapper_scan_declaration_checked():
  def f(x, h):
    return x, h

  with pytest.raises(ValueError, match=r"batch_partitionable\(f\): scan names the dim 't', "
                                       r"which is a dim of the state operand 0"):
    bp.batch_partitionable(f, signature="(t),()->(t),()", scan={"t": bp.Scan(state=(0, 1))})
