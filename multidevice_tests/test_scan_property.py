"""A property test of scanned dims over drawn meshes, shardings, sizes,
batch layouts, directions and modes: the sharded call equals the unsharded
one, integer kernels bit for bit; the compiled program never gathers the
sequence."""

import re

import jax
import numpy as np
import pytest
from hypothesis import given, strategies as st
from jax.sharding import NamedSharding

import batchpart as bp
from batchpart import testing as kernels

from helpers import draw_auto_mesh, property_settings, random_spec

S = jax.ShapeDtypeStruct
EXAMPLES = 30


@pytest.mark.timeout(900)
@property_settings(EXAMPLES)
@given(data=st.data())
def test_scans_equal_the_unsharded_call(partitioner, data):
  mesh = draw_auto_mesh(data, [(8,), (2, 4), (4, 2)])
  reverse = data.draw(st.booleans(), label="reverse")
  parallel = data.draw(st.booleans(), label="parallel")
  size = data.draw(st.sampled_from([4, 8, 12, 16, 24, 32, 40]), label="t")
  batch = data.draw(st.sampled_from([(), (1,), (2,), (4,), (2, 3)]), label="batch")
  shape = (*batch, size)
  spec = random_spec(data, mesh, len(shape), "input")
  rng = np.random.default_rng(size * 31 + len(batch))
  x = rng.integers(-2**30, 2**30, shape).astype(np.int32)
  s0 = rng.integers(-2**30, 2**30, shape[:-1]).astype(np.int32)
  scan = bp.Scan((1, 1), merge=kernels.add_merge if parallel else None, reverse=reverse)
  f = bp.ffi_call("batchpart_test_prefix_sum", (S(shape, np.int32), S(shape[:-1], np.int32)),
                  signature="(t),()->(t),()", scan={"t": scan})

  def call(x, s0):
    x = jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))
    return f(x, s0, reverse=np.int64(reverse))

  fn = jax.jit(call)
  got = fn(x, s0)
  want = jax.jit(lambda x, s0: f(x, s0, reverse=np.int64(reverse)))(
      jax.device_put(x, jax.devices()[0]), jax.device_put(s0, jax.devices()[0]))
  for g, w in zip(got, want):
    np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
  entry = spec[-1] if len(spec) == len(shape) else None
  axes = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
  tiles = int(np.prod([mesh.shape[a] for a in axes]))
  if size % tiles == 0:
    # An even split stays: no collective brings any device the whole sequence.
    full = "s32[" + ",".join(map(str, shape)) + "]"
    text = fn.lower(x, s0).compile().as_text()
    moved = [line for line in text.splitlines()
             if re.search(r"(all-gather|all-to-all|collective-permute)(-start)?\(", line)]
    assert not any(full in line.split("(")[0] for line in moved), moved
