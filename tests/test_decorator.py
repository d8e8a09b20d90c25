"""The decorator: which operands are batched, and custom derivative rules."""

import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import batchpart as bp
from batchpart import _compat as compat, testing as kernels

S = jax.ShapeDtypeStruct
SOFTMAX = "batchpart_test_softmax"


def _targets(text):
  return re.findall(r'custom_call @"?([^"(\s]+)', text)


def _derived_names(text):
  """Each batchpart custom call's derived name, in order. On one device the
  call is emitted under the user's target, the derived name in its
  ``batchpart.derived_name`` frontend attribute; plain calls give None."""
  names = []
  for line in text.splitlines():
    match = re.search(r'custom_call @"?([^"(\s]+)', line)
    if match:
      attr = re.search(r'batchpart\.derived_name = "([^"]+)"', line)
      target = match.group(1)
      names.append(attr.group(1) if attr else target if "$bp1$" in target else None)
  return names


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


def _column_softmax_with_vjp():
  """softmax over dim 0 (the kernel on the transpose, inside a jit) as a
  custom_vjp whose forward function calls the kernel itself."""
  @jax.custom_vjp
  def columns(x):
    return jax.jit(lambda x: _plain_softmax(x.T)[0].T)(x)

  def fwd(x):
    y = _plain_softmax(x.T)[0].T
    return y, y

  def bwd(y, g):
    return (y * (g - jnp.sum(g * y, 0, keepdims=True)),)

  columns.defvjp(fwd, bwd)
  return columns


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
  names = _derived_names(text)
  assert len(names) == 2 and all(n.startswith(SOFTMAX + "$bp1$") for n in names)


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
  names = _derived_names(text)
  assert names and all(n.startswith(SOFTMAX + "$bp1$") for n in names)


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
  (name,) = _derived_names(text)
  assert "$o0,1$" in name   # w: batch rank 0, x: batch rank 1
  np.testing.assert_allclose(matvec(w, x), x @ w.T, rtol=1e-5, atol=1e-5)


# ---- which operands are shared: a forward dataflow from the wrapper's arguments ----

MATVEC = "batchpart_test_matvec"


def _plain_matvec(w, x):
  return jax.ffi.ffi_call(MATVEC, S((*x.shape[:-1], w.shape[0]), jnp.float32))(
      w, x, alpha=np.float64(1.0))


def _matvec_with_vjp(transform=lambda w: w):
  """matvec under a custom_vjp whose primal and forward rule call the kernel on
  ``transform(w)``; the backward rule is jnp."""
  @jax.custom_vjp
  def f(w, x):
    return _plain_matvec(transform(w), x)

  def fwd(w, x):
    return f(w, x), (w, x)

  def bwd(res, g):
    w, x = res
    wt = transform(w)
    return jax.grad(lambda w: jnp.sum(g * (x @ transform(w).T)))(w), g @ wt

  f.defvjp(fwd, bwd)
  return f


# Wrappers whose matrix w (8, 5) is shared by a batch of 8 vectors: every
# variant computes x @ (2 w).T, each deriving the kernel's matrix from w
# differently. w's leading dim equals the batch size, so only the dataflow
# (not the shape) tells that it is not batched.
SHARED = {
    "scaled": lambda w, x: _plain_matvec(w * 2.0, x),
    "astype": lambda w, x: _plain_matvec((w * 2.0).astype(jnp.bfloat16).astype(jnp.float32), x),
    "nested_jit": lambda w, x: jax.jit(lambda w, x: _plain_matvec(jax.jit(
        lambda w: w + w)(w), x))(w, x),
    "constant_added": lambda w, x: _plain_matvec(w + np.asarray(w_np()), x),
    "custom_vjp": lambda w, x: _matvec_with_vjp(lambda w: 2.0 * w)(w, x),
    "custom_jvp": lambda w, x: _matvec_with_jvp()(2.0 * w, x),
}


def w_np():
  """The shared matrix: a multiple of 1/8 so bfloat16 holds 2 w exactly."""
  return (np.random.default_rng(2).integers(-8, 8, (8, 5)) / 8).astype(np.float32)


def _matvec_with_jvp():
  @jax.custom_jvp
  def f(w, x):
    return _plain_matvec(w, x)

  @f.defjvp
  def f_jvp(primals, tangents):
    (w, x), (tw, tx) = primals, tangents
    return f(w, x), _plain_matvec(w, tx) + _plain_matvec(tw, x)

  return f


def test_shared_matrix_inside_custom_vjp_stays_whole():
  g = bp.batch_partitionable(_matvec_with_vjp(), signature="(m,n),(n)->(m)")
  w, x = w_np(), np.random.default_rng(3).standard_normal((8, 5)).astype(np.float32)
  (name,) = _derived_names(jax.jit(g).lower(w, x).as_text())
  assert "$o0,1$" in name   # w: batch rank 0, x: batch rank 1
  np.testing.assert_allclose(g(w, x), x @ w.T, rtol=1e-5, atol=1e-5)
  value_and_grad = jax.value_and_grad(lambda w, x: jnp.sum(g(w, x)), (0, 1))
  names = _derived_names(jax.jit(value_and_grad).lower(w, x).as_text())
  assert names and all("$o0,1$" in n for n in names)   # the forward rule's call too
  _, (gw, gx) = value_and_grad(w, x)
  np.testing.assert_allclose(gw, np.broadcast_to(x.sum(0), w.shape), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(gx, np.broadcast_to(w.sum(0), x.shape), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("variant", sorted(SHARED))
def test_transformed_shared_argument_stays_whole(variant):
  g = bp.batch_partitionable(SHARED[variant], signature="(m,n),(n)->(m)")
  w, x = w_np(), np.random.default_rng(4).standard_normal((8, 5)).astype(np.float32)
  names = _derived_names(jax.jit(g).lower(w, x).as_text())
  assert names and all("$o0,1$" in n for n in names), names
  np.testing.assert_allclose(g(w, x), x @ (2 * w).T, rtol=1e-5, atol=1e-5)


def test_value_mixing_a_batched_argument_follows_the_shape_rule():
  """w + x depends on the batched x: it is batched by its shape."""
  g = bp.batch_partitionable(lambda w, x: _plain_matvec(w, x + w[:, :5] * 0),
                             signature="(m,n),(n)->(m)")
  w = np.ones((8, 5), np.float32)
  x = np.random.default_rng(5).standard_normal((8, 5)).astype(np.float32)
  (name,) = _derived_names(jax.jit(g).lower(w, x).as_text())
  assert "$o0,1$" in name
  np.testing.assert_allclose(g(w, x), x @ w.T, rtol=1e-5, atol=1e-5)


@settings(max_examples=25, deadline=None)
@given(ops=st.lists(st.sampled_from(["scale", "neg", "transpose2", "jit", "abs", "const"]),
                    max_size=4),
       batch=st.integers(2, 6))
def test_any_chain_of_ops_on_a_shared_argument_keeps_it_whole(ops, batch):
  """Property: whatever is computed from the shared argument alone is shared,
  even when its leading dim equals the batch size."""
  steps = {"scale": lambda w: 3.0 * w, "neg": lambda w: -w, "abs": jnp.abs,
           "transpose2": lambda w: w.T.T, "jit": jax.jit(lambda w: w * 1.0),
           "const": lambda w: w + jnp.zeros(w.shape, w.dtype)}

  def chain(w):
    for op in ops:
      w = steps[op](w)
    return w

  g = bp.batch_partitionable(lambda w, x: _plain_matvec(chain(w), x),
                             signature="(m,n),(n)->(m)")
  rng = np.random.default_rng(batch)
  w = rng.standard_normal((batch, 3)).astype(np.float32)
  x = rng.standard_normal((batch, 3)).astype(np.float32)
  (name,) = _derived_names(jax.jit(g).lower(w, x).as_text())
  assert "$o0,1$" in name
  np.testing.assert_allclose(g(w, x), x @ np.asarray(chain(w)).T, rtol=1e-5, atol=1e-5)


# ---- calls that stay plain, and the warnings when nothing is partitioned ----

def test_call_with_only_shared_operands_stays_a_plain_call():
  """A call whose results have the batch shape but whose operands are all
  shared has nothing to partition by: XLA's default, no error."""
  @bp.batch_partitionable(signature="(n),(m,n)->(n)")
  def f(x, table):
    y, _ = _plain_softmax(x)
    t, _ = _plain_softmax(table * 2.0)   # (8, 6): the batch shape, but shared
    return y + t

  rng = np.random.default_rng(6)
  x = rng.standard_normal((8, 6)).astype(np.float32)
  table = rng.standard_normal((8, 6)).astype(np.float32)
  with warnings.catch_warnings():
    warnings.simplefilter("error", UserWarning)
    assert _derived_names(jax.jit(f).lower(x, table).as_text()) == [
        _derived_names(jax.jit(f).lower(x, table).as_text())[0], None]
    out = f(x, table)
  want = kernels.softmax_reference(x)[0] + kernels.softmax_reference(2 * table)[0]
  np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)


def test_call_with_no_operands_stays_a_plain_call():
  @bp.batch_partitionable(signature="(n)->(n)")
  def f(x):
    y, _ = _plain_softmax(x)
    z, _ = jax.ffi.ffi_call(SOFTMAX, (S(x.shape, x.dtype), S(x.shape[:-1], x.dtype)))()
    return y + z

  x = np.ones((8, 6), np.float32)
  names = _derived_names(jax.jit(f).lower(x).as_text())
  assert len(names) == 2 and names[0].startswith(SOFTMAX + "$bp1$") and names[1] is None


def _warnings_of(f, *args):
  """The UserWarnings that batchpart emits while ``f`` is traced."""
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    jax.make_jaxpr(f)(*args)
  return [str(w.message) for w in caught
          if issubclass(w.category, UserWarning) and "batchpart" in str(w.message)]


def test_kernel_called_per_problem_warns_once():
  @bp.batch_partitionable(signature="(n)->(n)")
  def per_row(x):
    return jnp.stack([_plain_softmax(x[i])[0] for i in range(x.shape[0])])

  x = np.random.default_rng(10).standard_normal((8, 6)).astype(np.float32)
  (message,) = _warnings_of(per_row, x)   # eight calls, one warning
  assert message.startswith(
      "batchpart.batch_partitionable(per_row): found no jax.ffi.ffi_call with the "
      "batch shape (8,) to partition; ")
  assert "without the batch shape" in message
  with pytest.warns(UserWarning, match=r"batch_partitionable\(per_row\)"):
    out = per_row(x)   # a new trace warns again; the values are right
  np.testing.assert_allclose(out, kernels.softmax_reference(x)[0], rtol=1e-5, atol=1e-6)


def test_calls_inside_a_loop_warn():
  @bp.batch_partitionable(signature="(n)->(n)")
  def looped(x):
    return jax.lax.map(lambda row: _plain_softmax(row)[0], x)

  x = np.random.default_rng(7).standard_normal((8, 6)).astype(np.float32)
  with pytest.warns(UserWarning, match=r"batch_partitionable\(looped\).*inside 'scan'"):
    out = looped(x)
  np.testing.assert_allclose(out, kernels.softmax_reference(x)[0], rtol=1e-5, atol=1e-6)


def test_wrapper_with_no_ffi_call_warns():
  f = bp.batch_partitionable(lambda x: x * 2, num_batch_dims=1)
  with pytest.warns(UserWarning, match="no jax.ffi.ffi_call"):
    f(np.ones((4, 3), np.float32))


def test_partitioned_wrapper_does_not_warn():
  g = bp.batch_partitionable(_softmax_with_vjp(), signature="(n)->(n)")
  assert _warnings_of(g, np.ones((4, 6), np.float32)) == []


# ---- jax.custom_batching.custom_vmap: its call jaxpr is rewritten ----

def _softmax_with_custom_vmap():
  @jax.custom_batching.custom_vmap
  def f(x):
    return _plain_softmax(x)[0]

  @f.def_vmap
  def f_vmap(axis_size, in_batched, x):
    return f(x), in_batched[0]

  return f


def test_custom_vmap_call_is_rewritten():
  g = bp.batch_partitionable(_softmax_with_custom_vmap(), signature="(n)->(n)")
  x = np.random.default_rng(8).standard_normal((8, 6)).astype(np.float32)
  assert _warnings_of(g, x) == []
  (name,) = _derived_names(jax.jit(g).lower(x).as_text())
  assert name.startswith(SOFTMAX + "$bp1$")
  np.testing.assert_allclose(g(x), kernels.softmax_reference(x)[0], rtol=1e-5, atol=1e-6)


def test_custom_vmap_rule_under_vmap_warns():
  """Under jax.vmap the custom_vmap's own rule runs, as the user wrote it."""
  g = bp.batch_partitionable(_softmax_with_custom_vmap(), signature="(n)->(n)")
  x = np.random.default_rng(9).standard_normal((2, 8, 6)).astype(np.float32)
  with pytest.warns(UserWarning, match=r"batch_partitionable\(f\).*custom_vmap"):
    out = jax.vmap(g)(x)
  np.testing.assert_allclose(out, kernels.softmax_reference(x)[0], rtol=1e-5, atol=1e-6)


# ---- where the batch dims are: the flow of the wrapper's batch dims ----

CORE_SUM = "batchpart_test_core_sum"


def _batchpart_calls(f, *args):
  """The parameters of every batchpart call in ``f``'s jaxpr, at any depth."""
  def walk(jaxpr):
    for eqn in jaxpr.eqns:
      if eqn.primitive.name == "batchpart_ffi_call":
        yield eqn.params
      for inner in compat.jaxprs_in_eqn(eqn):
        yield from walk(inner)
  return list(walk(jax.make_jaxpr(f)(*args).jaxpr))


def _places(params):
  """Each operand's and result's (leading core dims, trailing core dims)."""
  def of(kind):
    cores = params[f"{kind}_core_ranks"]
    return tuple(zip(params.get(f"{kind}_lead_ranks") or (0,) * len(cores), cores))
  return of("operand"), of("result")


def _rows_softmax(signature="(n,...)->(n,...)"):
  """The defect's wrapper: x is (n, batch), the kernel wants rows in front."""
  @bp.batch_partitionable(signature=signature)
  def rows_softmax(x):
    y, _ = _plain_softmax(x.T)
    return y.T
  return rows_softmax


@pytest.mark.parametrize("n, batch", [(4, 8), (8, 8), (16, 16)])
def test_a_core_dim_the_size_of_the_batch_is_not_taken_for_it(n, batch):
  """The kernel's operand is x.T: its batch dim is dim 0 whatever the sizes,
  and so is its result's (the wrapper returns its transpose)."""
  f = _rows_softmax()
  x = np.random.default_rng(20).standard_normal((n, batch)).astype(np.float32)
  with warnings.catch_warnings():
    warnings.simplefilter("error", UserWarning)
    (params,) = _batchpart_calls(f, x)
    out = f(x)
  assert _places(params) == (((0, 1),), ((0, 1), (0, 0)))
  np.testing.assert_allclose(out, kernels.softmax_reference(x.T)[0].T, rtol=1e-5, atol=1e-6)


def _sorted_rows_softmax(x):
  """As the defect's wrapper, through a primitive the flow does not know
  (a sort along the kernel's core dim)."""
  y, _ = _plain_softmax(jax.lax.sort(x.T, dimension=1))
  return y.T


def test_where_the_flow_cannot_tell_and_the_shape_fits_twice_the_call_stays_plain():
  f = bp.batch_partitionable(_sorted_rows_softmax, signature="(n,...)->(n,...)")
  x = np.random.default_rng(21).standard_normal((8, 8)).astype(np.float32)
  with pytest.warns(UserWarning) as caught:
    assert _batchpart_calls(f, x) == []
  (message,) = [str(w.message) for w in caught if "batchpart" in str(w.message)]
  assert message.startswith(
      "batchpart.batch_partitionable(_sorted_rows_softmax): the jax.ffi.ffi_call to "
      "'batchpart_test_softmax' stays unpartitioned")
  assert "fits operand 0 (shape (8, 8)) at dim 1 and at dim 0" in message
  with pytest.warns(UserWarning, match="stays unpartitioned"):
    out = f(x)
  np.testing.assert_allclose(out, kernels.softmax_reference(np.sort(x.T, 1))[0].T,
                             rtol=1e-5, atol=1e-6)


def test_where_the_flow_cannot_tell_an_unambiguous_shape_decides():
  f = bp.batch_partitionable(_sorted_rows_softmax, signature="(n,...)->(n,...)")
  x = np.random.default_rng(22).standard_normal((4, 8)).astype(np.float32)
  assert _warnings_of(f, x) == []
  (params,) = _batchpart_calls(f, x)
  assert _places(params) == (((0, 1),), ((0, 1), (0, 0)))
  np.testing.assert_allclose(f(x), kernels.softmax_reference(np.sort(x.T, 1))[0].T,
                             rtol=1e-5, atol=1e-6)


def test_the_warning_names_the_wrappers_qualified_name():
  @bp.batch_partitionable(signature="(n,...)->(n,...)")
  def wrapper(x):
    return _sorted_rows_softmax(x)

  (message,) = _warnings_of(wrapper, np.ones((8, 8), np.float32))
  assert f"({wrapper.__qualname__}): the jax.ffi.ffi_call to 'batchpart_test_softmax'" in (
      message)
  assert wrapper.__qualname__.endswith("<locals>.wrapper")


def test_a_call_that_stays_plain_anyway_does_not_warn_of_unclear_dims():
  """The shared table's (8, 8) softmax fits the batch shape at both of the
  rule's positions, but nothing batched goes in: plain, as before."""
  @bp.batch_partitionable(signature="(n,...),(m,k)->(n,...)")
  def f(x, table):
    return _plain_softmax(x.T)[0].T + _plain_softmax(table * 2.0)[0].sum()

  rng = np.random.default_rng(26)
  x = rng.standard_normal((6, 8)).astype(np.float32)
  table = rng.standard_normal((8, 8)).astype(np.float32)
  assert _warnings_of(f, x, table) == []
  assert len(_batchpart_calls(f, x, table)) == 1
  want = (kernels.softmax_reference(x.T)[0].T
          + kernels.softmax_reference(2 * table)[0].sum())
  np.testing.assert_allclose(f(x, table), want, rtol=1e-5, atol=1e-5)


def test_batch_dims_out_of_order_leave_the_call_plain():
  """Two batch dims swapped before the kernel: not one run in order."""
  @bp.batch_partitionable(num_batch_dims=2)
  def swapped(x):
    return jnp.swapaxes(_plain_softmax(jnp.swapaxes(x, 0, 1))[0], 0, 1)

  x = np.random.default_rng(23).standard_normal((4, 4, 6)).astype(np.float32)
  (message,) = _warnings_of(swapped, x)
  assert "operand 0 (shape (4, 4, 6)) carries the wrapper's batch dims out of order" in message
  with pytest.warns(UserWarning, match="out of order"):
    assert _batchpart_calls(swapped, x) == []
    out = swapped(x)
  np.testing.assert_allclose(out, kernels.softmax_reference(x)[0], rtol=1e-5, atol=1e-6)


def _core_sum_attrs(**counts):
  return {k: np.int64(v) for k, v in counts.items()}


@pytest.mark.parametrize("n, batch", [(4, 8), (8, 8)])
def test_a_results_batch_dims_follow_its_uses(n, batch):
  """The kernel returns (n, batch): batch dims after a core dim, which the
  shape rule ("(n),()->(n)": in front) would not find, or would find in the
  wrong place; the wrapper's transpose of it tells."""
  @bp.batch_partitionable(signature="(n),(m)->(n)")
  def f(x, w):
    r = jax.ffi.ffi_call(CORE_SUM, S((n, batch), x.dtype))(
        x.T, w, **_core_sum_attrs(x_lead=1, x_trail=0, y_lead=1, y_trail=0, out_lead=1,
                                  out_trail=0))
    return r.T

  rng = np.random.default_rng(24)
  x = rng.standard_normal((batch, n)).astype(np.float32)
  w = rng.standard_normal((3,)).astype(np.float32)
  (params,) = _batchpart_calls(f, x, w)
  assert _places(params) == (((1, 0), (0, 1)), ((1, 0),))   # w: whole
  want = np.broadcast_to((x.sum(1) + w.sum())[:, None], (batch, n))
  np.testing.assert_allclose(f(x, w), want, rtol=1e-5, atol=1e-5)


def test_transposed_wrapper_under_custom_vjp_and_jit():
  """The flow enters nested jits and the primal and forward rule of a
  custom_vjp, and walks back from their outputs."""
  f = bp.batch_partitionable(_column_softmax_with_vjp(), signature="(n,...)->(n,...)")
  x = np.random.default_rng(25).standard_normal((8, 8)).astype(np.float32)
  loss = jax.grad(lambda x: jnp.sum(f(x) * jnp.arange(8.0)[None]))
  assert _warnings_of(loss, x) == []
  calls = _batchpart_calls(loss, x)
  assert calls and all(_places(p) == (((0, 1),), ((0, 1), (0, 0))) for p in calls)
  want = jax.grad(lambda x: jnp.sum(jax.nn.softmax(x, 0) * jnp.arange(8.0)[None]))(x)
  np.testing.assert_allclose(loss(x), want, rtol=1e-4, atol=1e-5)
