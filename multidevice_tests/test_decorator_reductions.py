"""@bp.batch_partitionable(..., reduce=...) on 8 simulated devices, Shardy and
GSPMD: the wrapper's reduced dim is followed through its jaxpr (transposes,
elementwise steps, nested jits) to the kernel, which then runs on each
device's part and is combined by one all-reduce; where the kernel's result
has a dim of the reduced dim's size the call keeps the dim whole and warns
(correct values either way)."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import batchpart as bp
from batchpart import _hlo

from helpers import compiled_text, local_shapes, put, rng, the_custom_call

TARGET = "batchpart_test_reduce_rows"
P = jax.sharding.PartitionSpec


def _kernel(x, w, op=0):
  """The plain jax.ffi.ffi_call: out[..., k] = sum over n of w[..., n] x[..., n, k]."""
  out = jax.ShapeDtypeStruct((*x.shape[:-2], x.shape[-1]), x.dtype)
  return jax.ffi.ffi_call(TARGET, out)(x, w, op=np.int64(op), rows=np.int64(-1))


@bp.batch_partitionable(signature="(k,n),(n)->(k)", reduce={"n": "sum"})
def transposed(x, w):
  """Takes x with n last; the kernel wants it second to last."""
  return jax.jit(_kernel)(jnp.swapaxes(x, -1, -2), 2.0 * w) + 1.0


def _reference(x, w):
  return np.einsum("bkn,bn->bk", x, 2 * w) + 1


@pytest.mark.timeout(120)
def test_reduced_dim_followed_through_a_transpose(partitioner, mesh2x4):
  x = rng(0).normal(size=(4, 3, 64)).astype(np.float32)
  w = rng(1).normal(size=(4, 64)).astype(np.float32)
  xs, ws = put(x, mesh2x4, P("a", None, "b")), put(w, mesh2x4, P("a", "b"))
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    text = compiled_text(transposed, xs, ws)
    out = jax.jit(transposed)(xs, ws)
  assert local_shapes(the_custom_call(text, TARGET)) == [(2, 16, 3), (2, 16)]
  (reduce,) = _hlo.collectives(text)
  assert reduce.opcode == "all-reduce"
  np.testing.assert_allclose(out, _reference(x, w), rtol=1e-5, atol=1e-5)


@pytest.mark.timeout(120)
def test_result_dim_of_the_reduced_size_keeps_it_whole_and_warns(partitioner, mesh8):
  # k == n: whether the kernel combines over n cannot be told from shapes.
  x = rng(2).normal(size=(8, 16, 16)).astype(np.float32)
  w = rng(3).normal(size=(8, 16)).astype(np.float32)
  xs, ws = put(x, mesh8, P(None, None, "x")), put(w, mesh8, P(None, "x"))
  with pytest.warns(UserWarning, match=r"transposed.*keeps the reduced dim whole.*'n'"):
    out = jax.jit(transposed)(xs, ws)
  np.testing.assert_allclose(out, _reference(x, w), rtol=1e-4, atol=1e-4)


def test_reduce_needs_a_signature_and_an_argument_dim():
  with pytest.raises(ValueError, match=r"batch_partitionable\(_f\).*only a signature"):
    bp.batch_partitionable(_f, num_batch_dims=1, reduce={"n": "sum"})
  with pytest.raises(ValueError, match=r"batch_partitionable\(_f\).*'k', which result\(s\) 0 "
                                       "keep; a wrapper's results cannot be followed"):
    bp.batch_partitionable(_f, signature="(n,k)->(k)", reduce={"k": "sum"})


def _f(x):
  return x
