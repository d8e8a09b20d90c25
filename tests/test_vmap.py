"""vmap: the mapped axis becomes one more leading batch dim, one custom call."""

import jax
import numpy as np
import pytest

import batchpart as bp
from batchpart import testing as kernels

rng = np.random.default_rng(1)


def _one_call_no_loop(f, *args):
  text = jax.jit(f).lower(*args).as_text()
  assert text.count("stablehlo.custom_call") == 1
  assert "stablehlo.while" not in text
  return text


@pytest.mark.parametrize("in_axes", [0, 1, 2, -1])
def test_vmap_any_axis(in_axes):
  x = rng.standard_normal((3, 4, 5)).astype(np.float32)
  f = jax.vmap(kernels.softmax, in_axes=in_axes)
  _one_call_no_loop(f, x)
  y, lse = f(x)
  ref_y, ref_lse = kernels.softmax_reference(np.moveaxis(x, in_axes, 0))
  np.testing.assert_allclose(y, ref_y, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(lse, ref_lse, rtol=1e-5, atol=1e-6)


def test_nested_vmap():
  x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
  f = jax.vmap(jax.vmap(kernels.softmax, in_axes=1), in_axes=3)
  _one_call_no_loop(f, x)
  ref = kernels.softmax_reference(np.moveaxis(np.moveaxis(x, 3, 0), 2, 1))
  np.testing.assert_allclose(f(x)[0], ref[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("in_axes", [(0, None), (None, 0), (1, 0), (None, 1)])
def test_vmap_mixed_batched_operands(in_axes):
  a = rng.standard_normal((4, 3, 3, 5)).astype(np.float32)
  v = rng.standard_normal((4, 5)).astype(np.float32)
  a_in = a if in_axes[0] is not None else a[0]
  v_in = v if in_axes[1] is not None else v[0]
  if in_axes[0] == 1:
    a_in = np.moveaxis(a, 0, 1)
  if in_axes[1] == 1:
    v_in = np.moveaxis(np.broadcast_to(v[:, None], (4, 3, 5)), 0, 1)[:, :, :]
  f = jax.vmap(lambda a, v: kernels.matvec(a, v, alpha=2.0), in_axes=in_axes)
  _one_call_no_loop(f, a_in, v_in)
  out = f(a_in, v_in)
  # reference: apply the unbatched function per mapped index
  n = (a_in.shape[in_axes[0]] if in_axes[0] is not None else v_in.shape[in_axes[1]])
  take = lambda x, ax, i: x if ax is None else np.take(x, i, axis=ax)
  ref = np.stack([2.0 * np.einsum("...ij,...j->...i", take(a_in, in_axes[0], i),
                                  take(v_in, in_axes[1], i)) for i in range(n)])
  np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def test_vmap_of_aliased_call_materialises_unbatched_alias():
  x = rng.standard_normal((3, 4)).astype(np.float32)
  y = rng.standard_normal((4,)).astype(np.float32)
  f = lambda x, y: bp.ffi_call("batchpart_test_axpy", jax.ShapeDtypeStruct(y.shape, y.dtype),
                               signature="(n),(n)->(n)", input_output_aliases={1: 0})(
                                   x, y, alpha=np.float64(2.0))
  out = jax.vmap(f, in_axes=(0, None))(x, y)
  np.testing.assert_allclose(out, 2 * x + y, rtol=1e-6)


def test_vmap_with_layouts():
  x = rng.standard_normal((3, 2, 4, 4)).astype(np.float32)
  f = lambda x: bp.ffi_call("batchpart_test_copy_bytes", jax.ShapeDtypeStruct(x.shape, x.dtype),
                            num_batch_dims=1, input_layouts=[(0, 2, 1)])(x)
  out = jax.vmap(f)(x)
  np.testing.assert_array_equal(out, np.swapaxes(x, -1, -2))


def test_vmap_num_batch_dims_broadcasts_unmapped_operands():
  """num_batch_dims promises equal batch dims to the kernel: an unmapped
  operand gets the mapped dim materialised (axpy needs equal shapes)."""
  x = rng.standard_normal((3, 4, 5)).astype(np.float32)
  y = rng.standard_normal((4, 5)).astype(np.float32)

  def axpy(x, y):
    return bp.ffi_call("batchpart_test_axpy", jax.ShapeDtypeStruct(x.shape, x.dtype),
                       num_batch_dims=1)(x, y, alpha=np.float64(3.0))

  out = jax.jit(jax.vmap(axpy, in_axes=(0, None)))(x, y)
  np.testing.assert_allclose(out, 3 * x + y, rtol=1e-6)
  x2 = np.swapaxes(x, 0, 1)   # (4, 3, 5), mapped along dim 1
  out = jax.jit(jax.vmap(axpy, in_axes=(None, 1), out_axes=1))(y, x2)
  np.testing.assert_allclose(out, 3 * y[:, None] + x2, rtol=1e-6)
