"""A property test of halo dims over drawn meshes, shardings, sizes (even
and uneven splits), windows, boundary rules and stated or unstated ends: the
sharded call equals the unsharded one bit for bit, the program holds no
collective but collective-permutes where the input already sits where the
plan wants it (with stated ends, one per direction that has a halo), and the
kernel sees a window of ``lo + part + hi`` elements along each split halo
dim, the last part holding at least ``lo + hi``, the whole dim along the
others."""

import math

import jax
import numpy as np
import pytest
from hypothesis import given, strategies as st
from jax.sharding import NamedSharding

import batchpart as bp
from batchpart import testing as kernels

from helpers import (
  collective_kinds,
  draw_auto_mesh,
  local_shapes,
  property_settings,
  random_spec,
  the_custom_call,
)

STENCIL = "batchpart_test_stencil"
EXAMPLES = 40


def _axes(entry):
  return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


@pytest.mark.timeout(600)
@property_settings(EXAMPLES)
@given(data=st.data())
def test_halo_calls_equal_the_unsharded_call(partitioner, data):
  mesh = draw_auto_mesh(data, [(8,), (2, 4), (4, 2)])
  rank = data.draw(st.sampled_from([1, 2]), label="halo dims")
  lo = data.draw(st.integers(0, 3), label="lo")
  hi = data.draw(st.integers(0, 3), label="hi")
  mode = data.draw(st.sampled_from(list(kernels.HALO_MODES)), label="mode")
  # The kernel's rules are named as bp.Halo's ends; "wrap" must be stated.
  ends = mode if mode == "wrap" or data.draw(st.booleans(), label="ends stated") else None
  sizes = [data.draw(st.sampled_from([4, 8, 12, 16, 24, 30, 32, 37, 61]), label=f"size {i}")
           for i in range(rank)]
  batch = data.draw(st.sampled_from([1, 2, 4]), label="batch")
  shape = (batch, *sizes)
  spec = random_spec(data, mesh, len(shape), "input")
  x = np.random.default_rng(len(sizes) * 7 + lo).standard_normal(shape).astype(np.float32)
  names = ("n", "m")[:rank]
  signature = f"({','.join(names)})->({','.join(names)})"
  attrs = dict(rank=np.int64(rank), lo=np.int64(lo), hi=np.int64(hi),
               mode=np.int64(kernels.HALO_MODES[mode]))

  def call(x):
    x = jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))
    return bp.ffi_call(STENCIL, jax.ShapeDtypeStruct(x.shape, x.dtype), signature=signature,
                       halo={k: bp.Halo(lo, hi, ends=ends) for k in names})(x, **attrs)

  f = jax.jit(call)
  want = jax.ffi.ffi_call(STENCIL, jax.ShapeDtypeStruct(x.shape, x.dtype))(x, **attrs)
  np.testing.assert_array_equal(np.asarray(f(x)), np.asarray(want))
  text = f.lower(x).compile().as_text()
  (local,) = local_shapes(the_custom_call(text, STENCIL))
  entries = [tuple(spec)[1 + i] if len(spec) > 1 + i else None for i in range(rank)]
  tiles = [math.prod(mesh.shape[a] for a in _axes(e)) for e in entries]
  for size, seen in zip(sizes, local[1:]):
    # Whole, or a window of lo + part + hi around parts of XLA's split whose
    # last holds at least lo + hi.
    part = seen - lo - hi
    assert seen == size or (0 < part < size and _last(size, part) >= max(lo + hi, 1)), (
        local, spec)
  even = [t == 1 or (n % t == 0 and n // t >= lo + hi) for n, t in zip(sizes, tiles)]
  if all(even):
    # The input sits where the plan wants it: halo exchanges only.
    if spec[0] is None:
      assert collective_kinds(text) <= {"collective-permute"}, (spec, text)
      if ends is not None:
        sides = (lo > 0) + (hi > 0)
        assert text.count(" collective-permute(") == sides * sum(t > 1 for t in tiles), text
    for size, seen, t in zip(sizes, local[1:], tiles):
      if t > 1:
        assert seen == size // t + lo + hi


def _last(size: int, part: int) -> int:
  """The last part's elements where XLA cuts ``size`` into parts of ``part``."""
  return size - (-(-size // part) - 1) * part
