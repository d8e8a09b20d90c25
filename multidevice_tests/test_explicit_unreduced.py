"""Explicit mode: operands whose type holds partial sums (``unreduced`` mesh
axes, e.g. a ``jnp.dot`` over a sharded contraction with
``out_sharding=P(..., unreduced={'x'})``) are refused by name; reduced ones
(``P(..., reduced={'x'})``, replicated values) are computed on."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, PartitionSpec as P, reshard

import batchpart as bp
from batchpart import testing as kernels

from helpers import put, rng

SOFTMAX = "batchpart_test_softmax"


def _softmax(x):
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


@pytest.fixture
def explicit8():
  return jax.make_mesh((8,), ("x",), axis_types=(AxisType.Explicit,))


def _factors(mesh, seed):
  a = rng(seed).standard_normal((16, 32), dtype=np.float32)
  b = rng(seed + 1).standard_normal((32, 8), dtype=np.float32)
  return a, b, put(a, mesh, P(None, "x")), put(b, mesh, P("x", None))


def _unreduced_dot(a, b):
  return jnp.dot(a, b, out_sharding=P(None, None, unreduced={"x"}))


@pytest.mark.timeout(120)
def test_unreduced_operand_names_target_operand_and_axes(partitioner, explicit8):
  _, _, a, b = _factors(explicit8, 0)
  w = put(np.ones((16, 8, 8), np.float32), explicit8, P())

  def f(w, a, b):
    c = _unreduced_dot(a, b)
    assert jax.typeof(c).sharding.spec.unreduced == {"x"}
    return kernels.matvec(w, c)   # operand 1 is the unreduced one

  with jax.set_mesh(explicit8):
    with pytest.raises(ValueError) as e:
      jax.jit(f).trace(w, a, b)
  text = str(e.value)
  assert "batchpart_test_matvec" in text and "operand 1" in text
  assert "('x',)" in text and "reshard" in text
  assert "dangerous" not in text


@pytest.mark.timeout(120)
def test_unreduced_operand_of_bp_linalg_and_ffi_call(partitioner, explicit8):
  _, _, a, b = _factors(explicit8, 2)
  with jax.set_mesh(explicit8):
    with pytest.raises(ValueError, match=r"'batchpart_potrf'.*operand 0 is unreduced"):
      jax.jit(lambda a, b: bp.linalg.cholesky(_unreduced_dot(a, b).reshape(2, 8, 8))
              ).trace(a, b)
    with pytest.raises(ValueError, match=rf"'{SOFTMAX}'.*operand 0 is unreduced"):
      jax.jit(lambda a, b: kernels.softmax(_unreduced_dot(a, b))).trace(a, b)


@pytest.mark.timeout(120)
def test_unreduced_operand_of_a_host_callback(partitioner, explicit8):
  _, _, a, b = _factors(explicit8, 6)

  def negate(x):
    return -x

  def f(a, b):
    c = _unreduced_dot(a, b)
    return bp.pure_callback(negate, jax.ShapeDtypeStruct(c.shape, c.dtype), c,
                            num_batch_dims=1)

  with jax.set_mesh(explicit8):
    with pytest.raises(ValueError, match=r"pure_callback\(.*negate\).*operand 0 is unreduced"):
      jax.jit(f).trace(a, b)


@pytest.mark.timeout(120)
def test_reduced_first_gives_the_values(partitioner, explicit8):
  if partitioner == "gspmd":
    pytest.skip("jax 0.10.2 lowers reshard of an unreduced value only under Shardy")
  a_np, b_np, a, b = _factors(explicit8, 4)

  def f(a, b):
    c = reshard(_unreduced_dot(a, b), P("x"))   # the all-reduce the error asks for
    return kernels.softmax(c)[0]

  with jax.set_mesh(explicit8):
    y = jax.jit(f)(a, b)
  assert jax.typeof(y).sharding.spec == P("x", None)
  np.testing.assert_allclose(np.asarray(y), _softmax(a_np @ b_np), rtol=1e-4, atol=1e-6)


@pytest.mark.timeout(120)
def test_reduced_operand_is_computed_on(partitioner, explicit8):
  x_np = rng(6).standard_normal((16, 8), dtype=np.float32)
  x = put(x_np, explicit8, P())

  def f(x):
    r = reshard(x, P(None, None, reduced={"x"}))
    assert jax.typeof(r).sharding.spec.reduced == {"x"}
    return kernels.softmax(r)[0]

  with jax.set_mesh(explicit8):
    y = jax.jit(f)(x)
  np.testing.assert_allclose(np.asarray(y), _softmax(x_np), rtol=1e-5, atol=1e-6)
