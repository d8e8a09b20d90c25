"""Host callbacks with halo dims on 8 devices: ``bp.pure_callback(...,
halo=...)`` and ``bp.partition_callback(..., halo=...)``, under Shardy and
GSPMD.

Each device calls the function on its window (``lo + part + hi`` elements
along each split halo dim), the results for the halo elements are dropped,
and ``with_index=True`` says where the window and the kept part lie. With
``scipy.ndimage`` filters the sharded results equal the whole-image filter
bit for bit in every mode (``"wrap"`` as ``periodic=True``).
"""

import threading

import jax
import numpy as np
import pytest
import scipy.ndimage as ndi
from jax.sharding import AxisType, PartitionSpec as P

import batchpart as bp

from helpers import collective_kinds, put, rng

S = jax.ShapeDtypeStruct
SIGMA = 1.5
RADIUS = int(4.0 * SIGMA + 0.5)   # scipy's gaussian_filter radius (truncate=4)


def halo2(width, periodic=False):
  return {"n": bp.Halo(width, width, periodic), "m": bp.Halo(width, width, periodic)}


@pytest.mark.parametrize("mode", ["reflect", "constant", "nearest", "mirror", "wrap"])
def test_gaussian_filter_per_window_equals_the_whole_image(partitioner, mesh2x4, mode):
  img = rng(1).standard_normal((64, 96)).astype(np.float32)
  seen = []
  lock = threading.Lock()

  def filt(x, index):
    with lock:
      seen.append((x.shape, index))
    return ndi.gaussian_filter(x, SIGMA, mode=mode)

  f = jax.jit(lambda x: bp.pure_callback(filt, S(x.shape, x.dtype), x,
                                         signature="(n,m)->(n,m)",
                                         halo=halo2(RADIUS, mode == "wrap"), with_index=True))
  xs = put(img, mesh2x4, P("a", "b"))
  out = f(xs)
  np.testing.assert_array_equal(np.asarray(out), ndi.gaussian_filter(img, SIGMA, mode=mode))
  assert out.sharding.spec == P("a", "b")
  assert collective_kinds(f.lower(xs).compile().as_text()) == {"collective-permute"}
  # One call per device, each on a window of lo + part + hi per dim, and the
  # kept parts tile the image once.
  assert len(seen) == 8
  assert {shape for shape, _ in seen} == {(32 + 2 * RADIUS, 24 + 2 * RADIUS)}
  kept = sorted((n[1].start, m[1].start) for _, (n, m) in seen)
  assert kept == [(r, c) for r in (0, 32) for c in (0, 24, 48, 72)]
  for _, (n, m) in seen:
    for window, part in (n, m):
      assert window.stop - window.start == part.stop - part.start + 2 * RADIUS
      assert window.start <= part.start and part.stop <= window.stop
      if mode != "wrap":
        assert window.start >= 0


def test_median_filter_with_batch_dims(partitioner, mesh2x4):
  imgs = rng(2).standard_normal((4, 48, 40)).astype(np.float64)
  with jax.enable_x64(True):
    f = jax.jit(lambda x: bp.pure_callback(
        lambda x: ndi.median_filter(x, size=(1, 5, 5), mode="nearest"),
        S(x.shape, x.dtype), x, signature="(n,m)->(n,m)", halo=halo2(2)))
    xs = put(imgs, mesh2x4, P("a", None, "b"))
    out = f(xs)
    text = f.lower(xs).compile().as_text()
  want = ndi.median_filter(imgs, size=(1, 5, 5), mode="nearest")
  np.testing.assert_array_equal(np.asarray(out), want)
  assert collective_kinds(text) == {"collective-permute"}


def test_results_of_the_wrong_window_shape_are_refused(partitioner, mesh8):
  x = rng(3).standard_normal((64,)).astype(np.float32)
  f = jax.jit(lambda x: bp.pure_callback(lambda x: x[1:], S(x.shape, x.dtype), x,
                                         signature="(n)->(n)", halo={"n": 1}))
  with pytest.raises(Exception, match=r"result 0 has shape \(9,\).*needs shape \(10,\)"):
    f(put(x, mesh8, P("x"))).block_until_ready()


def smooth(x):
  return ndi.uniform_filter1d(x, 3, mode="reflect", axis=-1)


def test_partition_callback_gives_a_package_s_pure_callback_the_halo(partitioner, mesh8):
  x = rng(4).standard_normal((2, 64)).astype(np.float32)
  package = jax.jit(lambda x: jax.pure_callback(smooth, S(x.shape, x.dtype), x))
  bp.partition_callback(smooth, signature="(n)->(n)", halo={"n": 1}, arrays="numpy")
  try:
    xs = put(x, mesh8, P(None, "x"))
    out = package(xs)
    text = package.lower(xs).compile().as_text()
  finally:
    bp.unpartition(smooth)
  np.testing.assert_array_equal(np.asarray(out), smooth(x))
  assert collective_kinds(text) == {"collective-permute"}


def box_of_row_sums(x):
  """y[i] = sum over k and over i - 1 .. i + 1 of x[i, k], zero outside."""
  s = np.asarray(x).sum(-1)
  padded = np.pad(s, [(0, 0)] * (s.ndim - 1) + [(1, 1)])
  return (padded[..., :-2] + padded[..., 1:-1] + padded[..., 2:]).astype(s.dtype)


def test_a_halo_dim_and_a_reduced_dim_in_one_signature(partitioner, mesh2x4):
  x = rng(5).integers(-9, 9, (4, 32, 8)).astype(np.int32)
  f = jax.jit(lambda x: bp.pure_callback(box_of_row_sums, S(x.shape[:-1], x.dtype), x,
                                         signature="(n,k)->(n)", halo={"n": 1},
                                         reduce={"k": "sum"}))
  xs = put(x, mesh2x4, P(None, "a", "b"))
  out = f(xs)
  np.testing.assert_array_equal(np.asarray(out), box_of_row_sums(x))
  kinds = collective_kinds(f.lower(xs).compile().as_text())
  assert kinds == {"collective-permute", "all-reduce"}


def test_explicit_mesh_types_a_callback_s_results_with_the_halo_sharding(partitioner):
  mesh = jax.make_mesh((2, 4), ("a", "b"), axis_types=(AxisType.Explicit,) * 2)
  img = rng(6).standard_normal((64, 96)).astype(np.float32)
  with jax.set_mesh(mesh):
    xs = put(img, mesh, P("a", "b"))
    f = jax.jit(lambda x: bp.pure_callback(lambda x: ndi.uniform_filter(x, 5),
                                           S(x.shape, x.dtype), x,
                                           signature="(n,m)->(n,m)", halo=halo2(2)))
    out = f(xs)
    assert jax.typeof(out).sharding.spec == P("a", "b")
    text = f.lower(xs).compile().as_text()
  np.testing.assert_array_equal(np.asarray(out), ndi.uniform_filter(img, 5))
  assert collective_kinds(text) == {"collective-permute"}


def correlate_and_scale(x, w, g):
  return ndi.correlate1d(x, w, mode="reflect", axis=-1) * g


def test_operands_without_the_halo_dim_or_with_fewer_batch_dims(partitioner, mesh2x4):
  """The weights have no halo dim (passed whole), the gains broadcast over
  the first batch dim: each window is computed with both."""
  x = rng(7).standard_normal((4, 2, 64))
  w, g = np.array([1.0, 2.0, 3.0]), np.array([[1.0], [2.0]])
  with jax.enable_x64(True):
    xs = put(x, mesh2x4, P("a", None, "b"))
    f = jax.jit(lambda x, w, g: bp.pure_callback(
        correlate_and_scale, S(x.shape, x.dtype), x, w, g, signature="(n),(k),(1)->(n)",
        halo={"n": 1}))
    out = f(xs, w, g)
    text = f.lower(xs, w, g).compile().as_text()
  np.testing.assert_array_equal(np.asarray(out), correlate_and_scale(x, w, g))
  assert out.sharding.spec == P("a", None, "b")
  assert collective_kinds(text) == {"collective-permute"}


def test_explain_counts_two_parts_whose_window_is_the_whole_dim(partitioner, mesh2x4):
  """The callback's block vector leads its operands: the explain still
  finds the slabs of n in the callback's own operand."""
  x = rng(7).standard_normal((3, 8)).astype(np.float32)
  f = jax.jit(lambda x: bp.pure_callback(lambda v: 2 * v, S(x.shape, x.dtype), x,
                                         signature="(n)->(n)", halo={"n": bp.Halo(1, 3)}))
  for spec, parts in ((P(None, "a"), 2), (P(), 1)):
    report = bp.explain(f, put(x, mesh2x4, spec))
    assert [(h.size, h.parts) for h in report.calls[0].halo_dims] == [(8, parts)]
