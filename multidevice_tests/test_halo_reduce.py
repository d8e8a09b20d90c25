"""A halo dim and a reduced dim in one FFI call, on a 2x4 mesh, under Shardy
and GSPMD.

``batchpart_test_row_stencil`` is ``(n,m)->(n)``: a weighted window along n
of the row sums over m. With ``halo={"n": ...}`` and ``reduce={"m": "sum"}``
each device runs it on its window of n and its part of m, keeps its part of
n, and the parts of m are summed: the compiled program exchanges slabs with
collective-permutes and sums with one all-reduce, and gathers nothing.
"""

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import batchpart as bp
from batchpart import _hlo, testing as kernels

from helpers import collective_kinds, local_shapes, put, rng, the_custom_call

ROW_STENCIL = "batchpart_test_row_stencil"
S = jax.ShapeDtypeStruct


def attrs(lo, hi, mode):
  return dict(lo=np.int64(lo), hi=np.int64(hi), mode=np.int64(kernels.HALO_MODES[mode]))


def row_stencil(x, lo, hi, mode):
  return bp.ffi_call(ROW_STENCIL, S(x.shape[:-1], x.dtype), signature="(n,m)->(n)",
                     halo={"n": bp.Halo(lo, hi, mode == "wrap")}, reduce={"m": "sum"})(
      x, **attrs(lo, hi, mode))


def unsharded(x, lo, hi, mode):
  x = np.asarray(x)
  return np.asarray(jax.ffi.ffi_call(ROW_STENCIL, S(x.shape[:-1], x.dtype))(
      x, **attrs(lo, hi, mode)))


@pytest.mark.parametrize("dtype", [np.int32, np.float32])
@pytest.mark.parametrize("mode, lo, hi", [("zero", 1, 1), ("reflect", 2, 1),
                                          ("wrap", 0, 3)])
def test_halo_and_reduced_dims_in_one_call_equal_the_unsharded_call(
    partitioner, mesh2x4, dtype, mode, lo, hi):
  x = rng(21).integers(-9, 9, (3, 32, 8)).astype(dtype)
  f = jax.jit(lambda x: row_stencil(x, lo, hi, mode))
  xs = put(x, mesh2x4, P(None, "a", "b"))
  out = np.asarray(f(xs))
  want = unsharded(x, lo, hi, mode)
  if dtype == np.int32:
    np.testing.assert_array_equal(out, want)
  else:
    np.testing.assert_allclose(out, want, rtol=1e-6)
  text = f.lower(xs).compile().as_text()
  assert collective_kinds(text) == {"collective-permute", "all-reduce"}
  assert sum(c.opcode.removesuffix("-start") == "all-reduce"
             for c in _hlo.collectives(text)) == 1
  # Each device: a window of 16 + lo + hi rows of its 2 of the 8 columns.
  assert local_shapes(the_custom_call(text, ROW_STENCIL)) == [(3, 16 + lo + hi, 2)]
