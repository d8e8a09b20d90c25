"""Aliasing, side effects, layouts and attributes survive
partitioning (the per-shard module restates them), under both partitioners."""

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import batchpart as bp
from batchpart import testing as kernels

from helpers import compiled_text, local_shapes, put, rng, the_custom_call


def axpy(x, y, *, alpha, aliased=True, has_side_effect=False):
  return bp.ffi_call(
      "batchpart_test_axpy", jax.ShapeDtypeStruct(y.shape, y.dtype),
      signature="(n),(n)->(n)",
      input_output_aliases={1: 0} if aliased else None,
      has_side_effect=has_side_effect)(x, y, alpha=np.float64(alpha))


@pytest.mark.parametrize("spec", [P("x"), P(None, "x")])
def test_input_output_aliasing_survives(partitioner, mesh8, spec):
  x = rng(0).standard_normal((16, 8), dtype=np.float32)
  y = rng(1).standard_normal((16, 8), dtype=np.float32)
  f = lambda x, y: axpy(x, y, alpha=3.0)
  args = put(x, mesh8, spec), put(y, mesh8, spec)
  call = the_custom_call(compiled_text(f, *args), "batchpart_test_axpy")
  assert "output_to_operand_aliasing={{}: (1, {})}" in call.text
  assert local_shapes(call) == [(2, 8), (2, 8)]
  np.testing.assert_allclose(jax.jit(f)(*args), 3 * x + y, rtol=1e-6)


def test_side_effect_survives_and_runs_once_per_shard(partitioner, mesh8):
  x = rng(2).standard_normal((16, 8), dtype=np.float32)
  def f(x):
    axpy(x, x, alpha=1.0, aliased=False, has_side_effect=True)  # result unused
    return x + 1
  xs = put(x, mesh8, P("x"))
  call = the_custom_call(compiled_text(f, xs), "batchpart_test_axpy")
  assert "custom_call_has_side_effect=true" in call.text
  assert local_shapes(call) == [(2, 8), (2, 8)]
  kernels.reset_batch_elements_processed()
  jax.block_until_ready(jax.jit(f)(xs))
  assert kernels.batch_elements_processed() == 16


def copy_bytes(x, *, input_layout, output_layout):
  return bp.ffi_call(
      "batchpart_test_copy_bytes", jax.ShapeDtypeStruct(x.shape, x.dtype),
      num_batch_dims=1, input_layouts=[input_layout],
      output_layouts=output_layout)(x)


@pytest.mark.parametrize("spec", [P("x"), P(None, "x")])
def test_layouts_survive(partitioner, mesh8, spec):
  """A column-major operand copied byte for byte into a row-major result is
  the transpose: lost layouts would return the input unchanged."""
  x = rng(3).standard_normal((16, 8, 8), dtype=np.float32)
  f = lambda x: copy_bytes(x, input_layout=(0, 2, 1), output_layout=(0, 1, 2))
  xs = put(x, mesh8, spec)
  call = the_custom_call(compiled_text(f, xs), "batchpart_test_copy_bytes")
  assert local_shapes(call) == [(2, 8, 8)]
  assert "{1,2,0}" in call.text  # minor-to-major of the column-major operand
  np.testing.assert_array_equal(jax.jit(f)(xs), np.swapaxes(x, 1, 2))


@pytest.mark.parametrize("alpha", [0.5, -3.0])
def test_attributes_survive(partitioner, mesh8, alpha):
  a = rng(4).standard_normal((16, 3, 8), dtype=np.float32)
  v = rng(5).standard_normal((16, 8), dtype=np.float32)
  f = lambda a, v: kernels.matvec(a, v, alpha=alpha)
  args = put(a, mesh8, P(None, None, "x")), put(v, mesh8, P(None, "x"))
  text = compiled_text(f, *args)
  call = the_custom_call(text, "batchpart_test_matvec")
  assert local_shapes(call) == [(2, 3, 8), (2, 8)]
  printed = call.text.replace("0000e+00", "").replace("00000e-01", "")
  assert f"alpha = {alpha:.1f}" in printed or "alpha" in call.text
  np.testing.assert_allclose(jax.jit(f)(*args), alpha * np.einsum("bij,bj->bi", a, v),
                             rtol=1e-5, atol=1e-5)
