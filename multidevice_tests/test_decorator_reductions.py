"""@bp.batch_partitionable(..., reduce=...) on 8 simulated devices, Shardy and
GSPMD: the wrapper's reduced dim is followed through its jaxpr (transposes,
elementwise steps, nested jits) to the kernel, which then runs on each
device's part and is combined by one all-reduce; a result that keeps the
dim, walked back from the wrapper's result that keeps it, stays split along
it; where the kernel's result has a dim of the reduced dim's size the flow
cannot place, the call keeps the dim whole and warns (correct values either
way)."""

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


WEIGH = "batchpart_test_weigh_rows"


@bp.batch_partitionable(signature="(n,k),(n)->(k),(n)", reduce={"n": "sum"})
def weigh(x, w):
  """The plain call of ``(n,k),(n)->(k),(n)``: total[k] = sum_n w[n] x[n, k]
  combines over n, row[n] = w[n] sum_k x[n, k] keeps it."""
  out = (jax.ShapeDtypeStruct((*x.shape[:-2], x.shape[-1]), x.dtype),
         jax.ShapeDtypeStruct(x.shape[:-1], x.dtype))
  total, row = jax.ffi.ffi_call(WEIGH, out)(x, 2.0 * w)
  return total + 1.0, jax.jit(lambda r: 3.0 * r)(row)


@pytest.mark.timeout(120)
def test_a_result_that_keeps_the_reduced_dim_stays_split(partitioner, mesh2x4):
  x = rng(4).normal(size=(4, 64, 3)).astype(np.float32)
  w = rng(5).normal(size=(4, 64)).astype(np.float32)
  xs, ws = put(x, mesh2x4, P("a", "b")), put(w, mesh2x4, P("a", "b"))
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    text = compiled_text(weigh, xs, ws)
    total, row = jax.jit(weigh)(xs, ws)
  np.testing.assert_allclose(total, np.einsum("bn,bnk->bk", 2 * w, x) + 1, rtol=1e-5,
                             atol=1e-5)
  np.testing.assert_allclose(row, 6 * w * x.sum(-1), rtol=1e-5, atol=1e-5)
  assert row.sharding.spec == P("a", "b")
  assert local_shapes(the_custom_call(text, WEIGH)) == [(2, 16, 3), (2, 16)]
  (reduce,) = _hlo.collectives(text)   # the total's; the row is never gathered
  assert reduce.opcode == "all-reduce" and [t.shape for t in reduce.result_types] == [(2, 3)]


def test_reduce_needs_a_signature_and_an_argument_dim():
  with pytest.raises(ValueError, match=r"batch_partitionable\(_f\).*only a signature"):
    bp.batch_partitionable(_f, num_batch_dims=1, reduce={"n": "sum"})


def _f(x):
  return x
