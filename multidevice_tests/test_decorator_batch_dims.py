"""The decorator on 8 devices where a kernel's core dim has the batch's size:
the flow of the wrapper's batch dims decides which dims are split, never the
shapes alone. Each case is checked against NumPy, on the compiled HLO (the
kernel's per-device shapes: the batch split, core dims whole), on the test
kernels' count of batch elements, and, where a call stays plain, for the
warning naming the wrapper and the call.

The hypothesis test draws wrappers: the wrapper's ``...`` in front, in the
middle or at the back, core sizes mostly equal to the batch size, the
kernel's own layout reached by a transpose or a chain of ``jnp.moveaxis``,
sometimes a reshape merging core dims, elementwise steps, a nested jit, a
primitive the flow does not know, and the result moved to the wrapper's
declared layout. Examples: 60 by default (``BATCHPART_DECORATOR_FLOW_EXAMPLES``).
"""

import os
import sys
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import event, given, strategies as st
from jax.sharding import AxisType, PartitionSpec as P

import batchpart as bp
from batchpart import _hlo, testing as kernels

from helpers import (
  collective_kinds,
  compiled_text,
  local_shapes,
  property_settings,
  put,
  the_custom_call,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import test_decorator as wrappers  # noqa: E402  (the one-device tests' wrappers)

EXAMPLES = int(os.environ.get("BATCHPART_DECORATOR_FLOW_EXAMPLES", "60"))
SOFTMAX, CORE_SUM = "batchpart_test_softmax", "batchpart_test_core_sum"
S = jax.ShapeDtypeStruct


def _attrs(x_lead, x_trail, out_lead, out_trail):
  """core_sum's attributes for an operand x, a whole vector y and the result."""
  return {k: np.int64(v) for k, v in dict(
      x_lead=x_lead, x_trail=x_trail, y_lead=1, y_trail=0, out_lead=out_lead,
      out_trail=out_trail).items()}


@bp.batch_partitionable(signature="(n,...),(m)->(n,...)")
def rows_core_sum(x, w):
  """The defect's wrapper around core_sum: x is (n, batch), the kernel wants
  rows in front."""
  r = jax.ffi.ffi_call(CORE_SUM, S(x.T.shape, x.dtype))(x.T, w, **_attrs(0, 1, 0, 1))
  return r.T


def _batchpart_warnings(caught):
  return [str(w.message) for w in caught
          if issubclass(w.category, UserWarning) and "batchpart" in str(w.message)]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kernel", ["softmax", "core_sum"])
@pytest.mark.parametrize("n, batch", [(4, 8), (8, 8), (16, 16)])
def test_transposing_wrapper_splits_the_batch_not_the_core_dim(partitioner, mesh8, kernel,
                                                               n, batch):
  rng = np.random.default_rng(n + batch)
  x = rng.standard_normal((n, batch)).astype(np.float32)
  w = rng.standard_normal((3,)).astype(np.float32)
  xs = put(x, mesh8, P(None, "x"))   # the batch dim
  if kernel == "softmax":
    f, args, target = wrappers._rows_softmax(), (xs,), SOFTMAX
    want = kernels.softmax_reference(x.T)[0].T
  else:
    f, args, target = rows_core_sum, (xs, w), CORE_SUM
    want = np.broadcast_to(x.sum(0) + w.sum(), (n, batch))
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    text = compiled_text(f, *args)
    kernels.reset_batch_elements_processed()
    out = jax.block_until_ready(jax.jit(f)(*args))
  np.testing.assert_allclose(np.asarray(out), want, rtol=1e-5, atol=1e-5)
  assert _batchpart_warnings(caught) == []
  assert local_shapes(the_custom_call(text, target))[0] == (batch // 8, n)
  assert not collective_kinds(text) & {"all-gather", "all-to-all"}, collective_kinds(text)
  assert kernels.batch_elements_processed() == batch   # each row once


@pytest.mark.timeout(300)
def test_a_call_whose_batch_dims_are_unclear_runs_whole_and_warns(partitioner, mesh8):
  f = bp.batch_partitionable(wrappers._sorted_rows_softmax, signature="(n,...)->(n,...)")
  x = np.random.default_rng(30).standard_normal((8, 8)).astype(np.float32)
  xs = put(x, mesh8, P(None, "x"))
  with pytest.warns(UserWarning) as caught:
    text = compiled_text(f, xs)
  (message,) = _batchpart_warnings(caught)
  assert "(_sorted_rows_softmax)" in message and repr(SOFTMAX) in message
  assert local_shapes(the_custom_call(text, SOFTMAX)) == [(8, 8)]   # whole
  kernels.reset_batch_elements_processed()
  out = jax.block_until_ready(jax.jit(f)(xs))   # traced already: no second warning
  assert kernels.batch_elements_processed() == 8 * 8   # every device, every row
  np.testing.assert_allclose(np.asarray(out), kernels.softmax_reference(np.sort(x.T, 1))[0].T,
                             rtol=1e-5, atol=1e-6)


@pytest.mark.timeout(300)
def test_grad_of_a_transposing_custom_vjp_wrapper(partitioner, mesh8):
  """The primal and forward rule's calls, inside a jit, split the batch."""
  f = bp.batch_partitionable(wrappers._column_softmax_with_vjp(),
                             signature="(n,...)->(n,...)")
  x = np.random.default_rng(31).standard_normal((8, 8)).astype(np.float32)
  weights = np.arange(64, dtype=np.float32).reshape(8, 8)
  value_and_grad = jax.value_and_grad(lambda x: jnp.sum(f(x) * weights))
  xs = put(x, mesh8, P(None, "x"))
  text = compiled_text(value_and_grad, xs)
  calls = _hlo.custom_calls(text, SOFTMAX)
  assert calls and all(local_shapes(c) == [(1, 8)] for c in calls)
  value, grad = jax.jit(value_and_grad)(xs)
  ref = jax.value_and_grad(lambda x: jnp.sum(jax.nn.softmax(x, 0) * weights))
  want_value, want_grad = ref(x)
  np.testing.assert_allclose(value, want_value, rtol=1e-4)
  np.testing.assert_allclose(np.asarray(grad), want_grad, rtol=1e-4, atol=1e-4)


# ---- drawn wrappers -----------------------------------------------------------------

def _moveaxis_chain(x, perm):
  """``jnp.transpose(x, perm)`` as a chain of ``jnp.moveaxis``."""
  order = list(range(x.ndim))
  for i, p in enumerate(perm):
    x = jnp.moveaxis(x, order.index(p), i)
    order.insert(i, order.pop(order.index(p)))
  return x


def _draw_merge(data, shape, batch_at):
  """Sometimes two adjacent core dims on one side of the batch dim, merged:
  the merged shape and where the batch dim then is."""
  pairs = [i for i in range(len(shape) - 1) if batch_at not in (i, i + 1)]
  if not pairs or not data.draw(st.booleans(), label="merge two core dims"):
    return shape, batch_at
  i = data.draw(st.sampled_from(pairs), label="merged pair")
  merged = (*shape[:i], shape[i] * shape[i + 1], *shape[i + 2:])
  return merged, batch_at - (i < batch_at)


def _group(prefix, shape, batch_at):
  """A signature group for ``shape`` with its batch dim at ``batch_at``."""
  names = [f"{prefix}{d}" for d in range(len(shape)) if d != batch_at]
  return "(" + ",".join([*names[:batch_at], "...", *names[batch_at:]]) + ")"


@pytest.mark.timeout(max(600, 10 * EXAMPLES))
@property_settings(EXAMPLES)
@given(data=st.data())
def test_drawn_wrappers_give_numpy_values_and_never_split_a_core_dim(data):
  draw = data.draw
  partitioner = draw(st.sampled_from(["shardy", "gspmd"]), label="partitioner")
  batch = draw(st.sampled_from([8, 16]), label="batch size")

  def sizes(n, label):
    return [draw(st.sampled_from([batch, batch, 2, 8, 16]), label=label) for _ in range(n)]

  # The wrapper's x: its '...' in front, in the middle or at the back.
  x_lead = sizes(draw(st.integers(0, 2), label="x: core dims before '...'"), "x lead size")
  x_trail = sizes(draw(st.integers(0 if x_lead else 1, 2), label="x: core dims after"),
                  "x trail size")
  x_shape, x_at = (*x_lead, batch, *x_trail), len(x_lead)
  # The kernel's layout of x: x's dims in a drawn order, maybe two core dims merged.
  perm = draw(st.permutations(range(len(x_shape))), label="kernel's dim order")
  moved_shape, k_at = _draw_merge(data, tuple(x_shape[p] for p in perm), perm.index(x_at))
  # The kernel's result, and the wrapper's output: the result's dims in a drawn order.
  out_core = sizes(draw(st.integers(0, 2), label="result core dims"), "result core size")
  r_at = draw(st.integers(0, len(out_core)), label="result batch dim")
  r_shape = (*out_core[:r_at], batch, *out_core[r_at:])
  out_perm = draw(st.permutations(range(len(r_shape))), label="output dim order")
  out_shape, o_at = tuple(r_shape[p] for p in out_perm), out_perm.index(r_at)
  m = draw(st.sampled_from([batch, 3]), label="w size")
  signature = f"{_group('x', x_shape, x_at)},(m)->{_group('o', out_shape, o_at)}"
  # A primitive the flow does not know (a sort along a core dim: core_sum's
  # sums stay), only where the kernel's batch dim is at a position the shape
  # rule looks at: elsewhere the rule may be wrong, as documented.
  looked_at = {x_at, o_at, 0}
  opaque = (len(moved_shape) > 1 and k_at in looked_at
            and draw(st.booleans(), label="opaque primitive"))
  scale = draw(st.booleans(), label="scale by 2")
  half = draw(st.booleans(), label="round through float16")
  nested = draw(st.booleans(), label="nested jit")
  how = draw(st.sampled_from(["transpose", "moveaxis"]), label="how the dims move")
  attrs = _attrs(k_at, len(moved_shape) - k_at - 1, r_at, len(r_shape) - r_at - 1)

  def to_kernel(x):
    x = jnp.transpose(x, perm) if how == "transpose" else _moveaxis_chain(x, perm)
    x = x.reshape(moved_shape)
    if scale:
      x = x * 2.0
    if half:
      x = x.astype(jnp.float16).astype(jnp.float32)
    if opaque:
      x = jax.lax.sort(x, dimension=0 if k_at else len(moved_shape) - 1)
    return x

  def wrapper(x, w):
    xk = (jax.jit(to_kernel) if nested else to_kernel)(x)
    r = jax.ffi.ffi_call(CORE_SUM, S(r_shape, x.dtype))(xk, w, **attrs)
    return jnp.transpose(r, out_perm)

  f = bp.batch_partitionable(wrapper, signature=signature)
  rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1), label="values seed"))
  x = rng.standard_normal(x_shape).astype(np.float32)
  w = rng.standard_normal((m,)).astype(np.float32)
  values = (2 * x if scale else x)
  values = values.astype(np.float16).astype(np.float32) if half else values
  per_batch = np.moveaxis(values, x_at, 0).reshape(batch, -1).sum(1, dtype=np.float64)
  result = np.broadcast_to(
      (per_batch + w.sum()).reshape((1,) * r_at + (batch,) + (1,) * (len(r_shape) - r_at - 1)),
      r_shape)
  want = np.transpose(result, out_perm)

  mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))
  sharded = draw(st.sampled_from([d for d, s in enumerate(x_shape) if s % 8 == 0] + [None]),
                 label="x's sharded dim")
  xs = put(x, mesh, P(*("x" if d == sharded else None for d in range(len(x_shape)))))
  fits = [p for p in looked_at if moved_shape[p:p + 1] == (batch,)]
  unclear = opaque and len(fits) > 1
  event("call left plain (unclear)" if unclear else "call partitioned")
  event(f"core sizes equal to the batch size: {sum(s == batch for s in moved_shape) - 1}")
  previous = jax.config.jax_use_shardy_partitioner
  jax.config.update("jax_use_shardy_partitioner", partitioner == "shardy")
  try:
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter("always")
      text = compiled_text(f, xs, w)
      kernels.reset_batch_elements_processed()
      out = np.asarray(jax.block_until_ready(jax.jit(f)(xs, w)))
  finally:
    jax.config.update("jax_use_shardy_partitioner", previous)
  context = f"signature {signature}, kernel layout {moved_shape} (batch at {k_at})"
  np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4, err_msg=context)
  messages = _batchpart_warnings(caught)
  x_local, w_local = local_shapes(the_custom_call(text, CORE_SUM))
  assert w_local == (m,), context
  if unclear:
    assert messages and all("<locals>.wrapper): the jax.ffi.ffi_call to " + repr(CORE_SUM)
                            in msg for msg in messages), (context, messages)
    assert x_local == moved_shape, context
  else:
    assert messages == [], (context, messages)
    local_batch = x_local[k_at]
    assert local_batch in (batch // 8, batch), context
    if sharded == x_at:
      assert local_batch == batch // 8, context
    assert x_local == (*moved_shape[:k_at], local_batch, *moved_shape[k_at + 1:]), context
  assert kernels.batch_elements_processed() == 8 * x_local[k_at], context
