"""The decorator: which operands are batched, and custom derivative rules."""

import re

import jax
import jax.numpy as jnp
import numpy as np

import batchpart as bp
from batchpart import testing as kernels

S = jax.ShapeDtypeStruct
SOFTMAX = "batchpart_test_softmax"


def _targets(text):
  return re.findall(r'custom_call @"?([^"(\s]+)', text)


def _plain_softmax(x):
  return jax.ffi.ffi_call(SOFTMAX, (S(x.shape, x.dtype), S(x.shape[:-1], x.dtype)))(x)


def _softmax_with_vjp():
  """The JAX FFI tutorial's pattern: a custom_vjp whose primal, forward and
  backward functions all call the FFI target."""
  @jax.custom_vjp
  def softmax(x):
    return _plain_softmax(x)[0]

  def fwd(x):
    y, _ = _plain_softmax(x)
    return y, y

  def bwd(y, g):
    # The kernel once more (its value does not change the gradient).
    extra = _plain_softmax(g)[0]
    return (y * (g - jnp.sum(g * y, -1, keepdims=True)) + 0 * extra,)

  softmax.defvjp(fwd, bwd)
  return softmax


def test_custom_vjp_wrapper_values_and_grad():
  f = _softmax_with_vjp()
  g = bp.batch_partitionable(f, signature="(n)->(n)")
  x = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)
  np.testing.assert_allclose(g(x), kernels.softmax_reference(x)[0], rtol=1e-5, atol=1e-6)
  w = jnp.arange(6.0, dtype=np.float32)
  grad = jax.grad(lambda x: jnp.sum(g(x) * w))(x)
  want = jax.grad(lambda x: jnp.sum(jax.nn.softmax(x) * w))(x)
  np.testing.assert_allclose(grad, want, rtol=1e-4, atol=1e-5)


def test_custom_vjp_wrapper_calls_are_batchpart_calls_forward_and_backward():
  g = bp.batch_partitionable(_softmax_with_vjp(), signature="(n)->(n)")
  x = np.ones((4, 6), np.float32)
  text = jax.jit(jax.grad(lambda x: jnp.sum(g(x)))).lower(x).as_text()
  targets = _targets(text)
  assert len(targets) == 2 and all(t.startswith(SOFTMAX + "$bp1$") for t in targets)


def test_custom_jvp_wrapper():
  @jax.custom_jvp
  def f(x):
    return _plain_softmax(x)[0]

  @f.defjvp
  def f_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    y = f(x)
    return y, y * (t - jnp.sum(t * y, -1, keepdims=True))

  g = bp.batch_partitionable(f, signature="(n)->(n)")
  x = np.random.default_rng(1).standard_normal((3, 5)).astype(np.float32)
  w = jnp.arange(5.0, dtype=np.float32)
  np.testing.assert_allclose(jax.grad(lambda x: jnp.sum(g(x) * w))(x),
                             jax.grad(lambda x: jnp.sum(jax.nn.softmax(x) * w))(x),
                             rtol=1e-4, atol=1e-5)
  text = jax.jit(jax.jvp, static_argnums=0).lower(g, (x,), (x,)).as_text()
  assert all(t.startswith(SOFTMAX + "$bp1$") for t in _targets(text))


def test_signature_core_ranks_decide_for_the_wrappers_arguments():
  """A shared matrix whose leading dim happens to equal the batch size is
  not batched: the signature says it is all core dims."""
  @bp.batch_partitionable(signature="(m,n),(n)->(m)")
  def matvec(w, x):
    return jax.ffi.ffi_call("batchpart_test_matvec", S((x.shape[0], w.shape[0]), x.dtype))(
        w, x, alpha=np.float64(1.0))

  w = np.random.default_rng(2).standard_normal((8, 5)).astype(np.float32)
  x = np.random.default_rng(3).standard_normal((8, 5)).astype(np.float32)
  text = jax.jit(matvec).lower(w, x).as_text()
  (target,) = _targets(text)
  assert "$o0,1$" in target   # w: batch rank 0, x: batch rank 1
  np.testing.assert_allclose(matvec(w, x), x @ w.T, rtol=1e-5, atol=1e-5)
