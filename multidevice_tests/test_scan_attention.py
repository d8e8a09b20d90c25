"""Causal linear attention (a d×e state per head, states add) with the
sequence split 8 ways: two passes around one all-gather of the parts' final
states, against NumPy."""

import re

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import batchpart.testing as bt

pytestmark = pytest.mark.timeout(300)


def attention_ref(q, k, v, s0, reverse=False):
  o = np.zeros(q.shape[:-1] + v.shape[-1:], q.dtype)
  s = s0.copy()
  steps = range(q.shape[-2])
  for i in (reversed(steps) if reverse else steps):
    s = s + k[..., i, :, None] * v[..., i, None, :]
    o[..., i, :] = np.einsum("...d,...de->...e", q[..., i, :], s)
  return o, s


@pytest.mark.parametrize("reverse", [False, True])
def test_linear_attention_two_passes(partitioner, mesh2x4, reverse):
  rng = np.random.default_rng(0)
  b, h, t, d, e = 2, 3, 32, 8, 4
  q, k = rng.normal(size=(2, b, h, t, d))
  v = rng.normal(size=(b, h, t, e))
  s0 = rng.normal(size=(b, h, d, e))
  with jax.enable_x64(True):
    f = bt.linear_attention(q.shape, e, np.float64, reverse=reverse)
    fn = jax.jit(lambda q, k, v, s0: f(q, k, v, s0, reverse=np.int64(reverse)))
    split = NamedSharding(mesh2x4, P("a", None, "b", None))
    args = [jax.device_put(x, split) for x in (q, k, v)]
    args.append(jax.device_put(s0, NamedSharding(mesh2x4, P("a"))))
    o, st = fn(*args)
    text = fn.lower(*args).compile().as_text()
  want = attention_ref(q, k, v, s0, reverse)
  # The states add in another order: a few ulps.
  np.testing.assert_allclose(np.asarray(o), want[0], rtol=1e-12, atol=1e-12)
  np.testing.assert_allclose(np.asarray(st), want[1], rtol=1e-12, atol=1e-12)
  assert o.sharding.spec == P("a", None, "b")
  gathers = [line for line in text.splitlines() if re.search(r"\ball-gather(-start)?\(", line)]
  # One gather of the 4 parts' final states (1 x 3 heads x 8 x 4 each).
  assert len(gathers) == 1 and "[4,1,3,8,4]" in gathers[0], gathers
