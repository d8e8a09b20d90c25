"""Stated ends (``bp.Halo(lo, hi, ends=...)``) and uneven splits of halo
dims on 8 devices, under Shardy and GSPMD.

With the kernel's boundary rule stated, each device receives ``lo``
elements from below and ``hi`` from above, as a hand-written exchange does,
and batchpart pads the array's true ends by the rule: a causal window
(``hi = 0``) takes one collective-permute, the bytes of the hand-written
exchange, and a zero rule no padding at all. Uneven splits (XLA's parts of
``ceil(n / parts)``, the last short) stay sharded where the last part holds
``lo + hi``. Values equal the unsharded call's: the C++ stencil's bit for
bit, ``scipy.ndimage.correlate1d`` through a host callback in every scipy
mode (a constant ``cval`` included) over drawn sizes, windows and meshes.
"""

import re

import jax
import numpy as np
import pytest
import scipy.ndimage as ndi
from hypothesis import given, strategies as st
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import batchpart as bp
from batchpart import testing as kernels

from helpers import (
  collective_lines,
  draw_auto_mesh,
  local_shapes,
  property_settings,
  put,
  rng,
  the_custom_call,
)

STENCIL = "batchpart_test_stencil"
LAPLACIAN = "batchpart_test_laplacian"
S = jax.ShapeDtypeStruct


def causal(x, k, ends="zero"):
  """A causal convolution of width ``k``: the stencil reading ``k - 1``
  elements below, zero before the array's start."""
  return bp.ffi_call(STENCIL, S(x.shape, x.dtype), signature="(n)->(n)",
                     halo={"n": bp.Halo(k - 1, 0, ends=ends)})(
      x, rank=np.int64(1), lo=np.int64(k - 1), hi=np.int64(0),
      mode=np.int64(kernels.HALO_MODES["zero"]))


def permuted_shapes(text: str) -> list[str]:
  """The result shapes of the compiled program's collective-permutes."""
  return [re.search(r"= (\S+) collective-permute", line).group(1)
          for line in collective_lines(text, "collective-permute")]


def test_a_causal_window_with_stated_ends_takes_one_permute_of_lo_elements(partitioner,
                                                                           mesh8):
  """lo = 3, hi = 0, zero ends: one collective-permute of 3 columns, no
  branch on the part (zeros are what arrives where nothing is sent); the
  unstated rule needs two of lo + hi each (its end windows shift inward)."""
  x = rng(0).standard_normal((4, 64)).astype(np.float32)
  xs = put(x, mesh8, P(None, "x"))
  want = np.asarray(causal(x, 4, ends=None))
  for ends, shapes in (("zero", ["f32[4,3]"]), (None, ["f32[4,3]", "f32[4,3]"])):
    f = jax.jit(lambda x, ends=ends: causal(x, 4, ends))
    np.testing.assert_array_equal(np.asarray(f(xs)), want)
    text = f.lower(xs).compile().as_text()
    assert [s.split("{")[0] for s in permuted_shapes(text)] == shapes, text
    assert local_shapes(the_custom_call(text, STENCIL)) == [(4, 8 + 3)]
    assert (" conditional(" in text) == (ends is None)


def test_a_laplacian_with_zero_ends_exchanges_what_a_hand_written_one_does(partitioner):
  """The 5-point Laplacian (zero outside) on a 2x4 mesh: four permutes of
  one row or column, the bytes of a shard_map that ppermutes one row and one
  column each way; bp.explain reports them."""
  mesh = jax.make_mesh((2, 4), ("a", "b"), axis_types=(AxisType.Auto,) * 2)
  u = rng(1).standard_normal((64, 64)).astype(np.float32)
  us = put(u, mesh, P("a", "b"))
  lap = jax.jit(lambda u: bp.ffi_call(
      LAPLACIAN, S(u.shape, u.dtype), signature="(n,m)->(n,m)",
      halo={"n": bp.Halo(1, 1, ends="zero"), "m": bp.Halo(1, 1, ends="zero")})(u))
  stock = jax.ffi.ffi_call(LAPLACIAN, S(u.shape, u.dtype))(u)
  np.testing.assert_array_equal(np.asarray(lap(us)), np.asarray(stock))
  text = lap.lower(us).compile().as_text()
  shapes = sorted(s.split("{")[0] for s in permuted_shapes(text))
  # n first (rows of the 16-column part), then m on the 34-row window.
  assert shapes == sorted(["f32[1,16]"] * 2 + ["f32[34,1]"] * 2), text
  report = str(bp.explain(lap, us))
  assert "ends constant" in report and "in 2 parts of 32" in report, report
  assert f"collective-permutes of {2 * 16 * 4 + 2 * 34 * 4} B per device" in report, report


@pytest.mark.parametrize("n, parts, part, last", [(61, 8, 8, 5), (30, 8, 4, 2)])
def test_an_uneven_split_stays_sharded(partitioner, mesh8, n, parts, part, last):
  """XLA pads the last part; the windows stay lo + part + hi, the values
  exact, nothing gathered before the call, and explain says the last part's
  length."""
  x = rng(2).standard_normal((4, n)).astype(np.float32)
  cut = NamedSharding(mesh8, P(None, "x"))
  for ends in (None, "zero"):
    f = jax.jit(lambda x, ends=ends: causal(jax.lax.with_sharding_constraint(x, cut), 3, ends)
                * 2)
    np.testing.assert_array_equal(np.asarray(f(x)), 2 * np.asarray(causal(x, 3, None)))
    text = f.lower(x).compile().as_text()
    assert local_shapes(the_custom_call(text, STENCIL)) == [(4, part + 2)]
    report = str(bp.explain(f, x))
    assert f"in {parts} parts of {part} (the last {last})" in report, report


def test_explicit_result_types_show_a_coarsened_split():
  """16 over a 2x4 mesh makes parts of 2 < lo + hi = 3: the result type
  keeps the halo dim on "a" (2 parts of 8) and moves "b" onto the rows, as
  the partitioner runs it; nothing is gathered."""
  mesh = jax.make_mesh((2, 4), ("a", "b"), axis_types=(AxisType.Explicit,) * 2)
  x = rng(3).standard_normal((4, 16)).astype(np.float32)
  xs = put(x, mesh, P(None, ("a", "b")))
  f = jax.jit(lambda x: causal(x, 4, None))
  with jax.set_mesh(mesh):
    out = f(xs)
    text = f.lower(xs).compile().as_text()
  assert jax.typeof(out).sharding.spec == P("b", "a")
  np.testing.assert_array_equal(np.asarray(out), np.asarray(causal(x, 4, None)))
  assert not collective_lines(text, "all-gather"), text


SCIPY_MODES = ("constant", "nearest", "reflect", "mirror", "wrap")


@pytest.mark.timeout(600)
@property_settings(30)
@given(data=st.data())
def test_scipy_filters_with_stated_ends_equal_the_whole_filter(partitioner, data):
  """A host callback of correlate1d in a drawn scipy mode over a drawn,
  possibly uneven, split: the values equal the whole array's filter, and
  each window the function sees is lo + part + hi long, at global
  positions running past the ends where the rule pads them."""
  mesh = draw_auto_mesh(data, [(8,), (2, 4), (4, 2)])
  axis = data.draw(st.sampled_from(mesh.axis_names + (mesh.axis_names,)), label="axis")
  lo, hi = data.draw(st.integers(0, 3), label="lo"), data.draw(st.integers(0, 3), label="hi")
  mode = data.draw(st.sampled_from(SCIPY_MODES), label="mode")
  cval = data.draw(st.sampled_from([0.0, 2.5]), label="cval") if mode == "constant" else 0.0
  n = data.draw(st.sampled_from([16, 24, 29, 37, 61, 64]), label="n")
  weights = np.arange(1.0, lo + hi + 2.0)
  origin = lo - (lo + hi + 1) // 2    # correlate1d's: the window i - lo .. i + hi
  x = rng(n + lo).standard_normal((3, n)).astype(np.float32)
  seen = []

  def filt(a, index):
    seen.append(index[-1])
    return ndi.correlate1d(a, weights, axis=-1, mode=mode, cval=cval, origin=origin)

  cut = NamedSharding(mesh, P(None, axis))
  f = jax.jit(lambda x: bp.pure_callback(
      filt, S(x.shape, x.dtype), jax.lax.with_sharding_constraint(x, cut),
      signature="(n)->(n)", halo={"n": bp.Halo(lo, hi, ends=mode, cval=cval)},
      with_index=True))
  got = np.asarray(f(x))
  want = ndi.correlate1d(x, weights, axis=-1, mode=mode, cval=cval, origin=origin)
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
  for window, kept in seen:
    if (kept.start, kept.stop) == (0, n):
      assert (window.start, window.stop) == (0, n)
      continue
    part = window.stop - window.start - lo - hi
    assert window.start == kept.start - lo and kept.start % part == 0, (window, kept)
    assert kept.stop == min(kept.start + part, n), (window, kept)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(ends="edge"), ValueError, "ends='edge' is not one of"),
    (dict(periodic=True, ends="reflect"), ValueError, "contradicts ends='reflect'"),
    (dict(ends="nearest", cval=1.0), ValueError, "cval=1.0 is the padding of ends='constant'"),
    (dict(ends="constant", cval="1"), TypeError, "cval must be a number"),
])
def test_bad_ends_are_refused_by_name(kwargs, error, match):
  with pytest.raises(error, match=re.escape(match)):
    bp.Halo(1, 1, **kwargs)


def test_zero_and_wrap_are_constant_zero_and_periodic():
  assert bp.Halo(1, 2, ends="zero") == bp.Halo(1, 2, ends="constant", cval=0)
  assert bp.Halo(1, 2, ends="wrap") == bp.Halo(1, 2, periodic=True)
