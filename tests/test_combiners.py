"""Named combiners on one device: ``reduce={"n": "argmax" | "argmin" | "max_k" | "min_k"
| "logsumexp"}``.

A combiner reads its results together, so their number, dtypes and shapes
are part of the declaration: each mismatch is refused where the call is
declared, naming the target or callback, the dim and the result. Every entry
point that takes ``reduce=`` accepts the combiners (``bp.io_callback`` keeps
refusing ``reduce=``); the derived name carries the combiner and reads back.
On one device nothing is split, so the values are the kernel's own.
"""

import re

import jax
import numpy as np
import pytest
from jax.interpreters import mlir

import batchpart as bp
from batchpart import _compat as compat, testing as kernels
from batchpart._vocab import derived_names
from batchpart._vocab.description import CallDescription
from batchpart._vocab.dims.reduced import Reduction

S = jax.ShapeDtypeStruct
ARG = "batchpart_test_arg_rows"
OWNER = re.escape(f"batchpart.ffi_call('{ARG}')")


def _declare(results, reduce, signature="(n)->(),()"):
  return bp.ffi_call(ARG, results, signature=signature, reduce=reduce)


@pytest.mark.parametrize("results, reduce, message", [
    ((S((4,), np.float32),), {"n": "argmax"},
     r"reduce 'argmax' over the dim\(s\) n needs exactly two results, \(value, index\); "
     r"the call has 1"),
    ((S((4,), np.float32), S((4,), np.float32)), {"n": "argmin"},
     r"'argmin' over the dim\(s\) n: result 1 \(the index\) has dtype float32"),
    ((S((4,), np.complex64), S((4,), np.int32)), {"n": "argmax"},
     r"result 0 \(the value\) has dtype complex64"),
    ((S((4,), np.float32), S((2, 2), np.int32)), {"n": "argmax"},
     r"result 0 \(the value\) has shape \(4,\) and result 1 \(the index\) \(2, 2\)"),
    ((S((4, 3), np.float32),), {"n": "max_k"},
     r"'max_k' over the dim\(s\) n needs exactly two results, \(values, indices\)"),
    ((S((4, 3), np.float32), S((4, 3), np.float32)), {"n": "min_k"},
     r"'min_k' over the dim\(s\) n: result 1 \(the indices\) has dtype float32"),
    ((S((4, 3), np.float32), S((4, 2), np.int32)), {"n": "max_k"},
     r"result 0 \(the values\) has shape \(4, 3\) and result 1 \(the indices\) \(4, 2\)"),
    ((S((4, 0), np.float32), S((4, 0), np.int32)), {"n": "max_k"},
     r"result 0 \(the values\) has shape \(4, 0\) with k = 0; k must be >= 1"),
    ((), {"n": "logsumexp"}, r"'logsumexp' over the dim\(s\) n needs at least one result"),
    ((S((4, 3), np.float32), S((4,), np.int32)), {"n": "logsumexp"},
     r"result 1 \(the lse\) has dtype int32"),
    ((S((4, 3), np.float32), S((4, 2), np.float32)), {"n": "logsumexp"},
     r"result 0 has shape \(4, 3\), which does not start with the lse's \(result 1\) shape "
     r"\(4, 2\) in its core dims"),
    ((S((4, 3), np.int32), S((4,), np.float32)), {"n": "logsumexp"},
     r"result 0 has dtype int32; a weighted average"),
])
def test_results_that_do_not_fit_the_combiner_are_refused(results, reduce, message):
  signature = "(n)->" + ",".join("(" + ",".join("k" * (len(r.shape) - 1)) + ")"
                                 for r in results)
  with pytest.raises(ValueError, match=OWNER + ".*" + message):
    _declare(list(results), reduce, signature)


def test_a_combiner_mixed_with_another_op_is_refused():
  with pytest.raises(ValueError, match=OWNER + r".*combines dims with different ops "
                                       r"\(dims n, m\); the combiner 'logsumexp' reads every "
                                       "result"):
    bp.ffi_call(ARG, [S((4,), np.float32)], signature="(n,m)->()",
                reduce={"n": "logsumexp", "m": "sum"})


def test_argmax_over_two_dims_is_refused():
  with pytest.raises(ValueError, match=OWNER + r".*reduce 'argmax' over the dims n, m: an "
                                       "index result counts along one dim"):
    bp.ffi_call(ARG, [S((4,), np.float32), S((4,), np.int32)], signature="(n,m)->(),()",
                reduce={"n": "argmax", "m": "argmax"})


def test_logsumexp_over_two_dims_is_accepted():
  bp.ffi_call(ARG, [S((4,), np.float32)], signature="(n,m)->()",
              reduce={"n": "logsumexp", "m": "logsumexp"})


def test_an_unknown_op_lists_the_combiners():
  with pytest.raises(ValueError, match="use one of 'sum', 'max', 'min', 'argmax', 'argmin', "
                                       "'max_k', 'min_k', 'logsumexp'"):
    _declare([S((4,), np.float32), S((4,), np.int32)], {"n": "top_k"})


@pytest.mark.parametrize("op", ["argmax", "argmin"])
def test_one_device_values_are_the_kernels(op):
  x = np.array([[3, 1, 3, np.nan, 2], [0, -1, 5, 5, -1]], np.float32)
  value, index = jax.jit(lambda x: kernels.arg_rows(x, op))(x)
  expected = (np.argmax if op == "argmax" else np.argmin)(x, axis=-1)
  np.testing.assert_array_equal(np.asarray(index), expected)
  np.testing.assert_array_equal(np.asarray(value), np.take_along_axis(x, expected[:, None],
                                                                      -1)[:, 0])


def test_lowered_call_names_its_combiner():
  text = jax.jit(lambda x: kernels.arg_rows(x, "argmin")).lower(
      np.zeros((2, 8), np.float32)).as_text()
  assert "$x:n=argmin:0.-1" in text


@pytest.mark.parametrize("op", ["max_k", "min_k"])
def test_one_device_top_k_is_the_kernels(op):
  x = np.array([[3, 1, 3, np.nan, 2, 7], [0, -1, 5, 5, -1, 5]], np.float32)
  values, index = jax.jit(lambda x: kernels.top_k_rows(x, 4, op))(x)
  expected_values, expected_index = kernels.top_k_reference(x, 4, op)
  np.testing.assert_array_equal(np.asarray(index), expected_index)
  np.testing.assert_array_equal(np.asarray(values), expected_values)
  assert list(expected_index[1]) == ([2, 3, 5, 0] if op == "max_k" else [1, 4, 0, 2])


def test_top_k_over_two_dims_is_refused():
  with pytest.raises(ValueError, match=OWNER + r".*reduce 'max_k' over the dims n, m: an "
                                       "index result counts along one dim"):
    bp.ffi_call(ARG, [S((4, 2), np.float32), S((4, 2), np.int32)],
                signature="(n,m)->(k),(k)", reduce={"n": "max_k", "m": "max_k"})


@pytest.mark.parametrize("op", ["argmax", "argmin", "max_k", "min_k", "logsumexp"])
def test_derived_names_carry_the_combiner_and_read_back(op):
  d = CallDescription("k", (1, 1), (1, 1), ((1, 0), (1, 0)), ((0,), (0,)),
                      reductions=(Reduction("n", op, ((0, -1), (1, -1))),))
  name = derived_names.encode(d)
  assert name.endswith(f"$x:n={op}:0.-1,1.-1")
  assert derived_names.decode(name) == d


@pytest.mark.parametrize("axis", [0, -1])
def test_derived_names_carry_where_a_top_k_holds_k(axis):
  d = CallDescription("k", (1, 1), (1, 1), ((1, 0), (2, 1, 0)),
                      ((2, 1, 0), (2, 1, 0)), operand_lead_ranks=(1, 0),
                      result_lead_ranks=(1, 1),
                      reductions=(Reduction("n", "max_k", ((0, 0), (1, -2)),
                                            k_dims=((0, axis), (1, axis))),))
  name = derived_names.encode(d)
  assert name.endswith(f"$x:n=max_k:0.0,1.-2:k0.{axis},1.{axis}")
  assert derived_names.decode(name) == d


def test_a_top_k_holding_k_in_a_batch_dim_is_refused():
  with pytest.raises(ValueError, match="result 0 has no core axis -2"):
    CallDescription("k", (1,), (1, 1), ((1, 0),), ((1, 0), (1, 0)),
                    reductions=(Reduction("n", "max_k", ((0, -1),),
                                          k_dims=((0, -2), (1, -2))),))


def test_names_written_before_the_combiners_still_read():
  d = derived_names.decode("k$bp1$o1,1$r1$no3,2$nr2$x:n=sum:0.-2,1.-1")
  assert d.reductions == (Reduction("n", "sum", ((0, -2), (1, -1))),)


# ---- every entry point ------------------------------------------------------------

def _arg_primitive(name):
  p = compat.Primitive(f"combiners_arg_rows_{name}")
  p.multiple_results = True
  p.def_abstract_eval(lambda x, **_: [compat.ShapedArray(x.shape[:-1], x.dtype),
                                      compat.ShapedArray(x.shape[:-1], np.int32)])
  return p


def test_adoption_entry_points_accept_a_combiner_and_check_its_results():
  decl = {"signature": "(n)->(),()", "reduce": {"n": "argmax"}}
  bp.partition_ffi_target(ARG, **decl)
  try:
    x = np.array([[1, 5, 5, 2]], np.float32)
    f = jax.jit(lambda x: jax.ffi.ffi_call(ARG, (S((1,), x.dtype), S((1,), np.int32)))(
        x, op=np.int64(0)))
    assert "$x:n=argmax:0.-1" in f.lower(x).as_text()
    assert int(f(x)[1][0]) == 1
    bad = jax.jit(lambda x: jax.ffi.ffi_call(ARG, (S((1,), x.dtype), S((1,), x.dtype)))(
        x, op=np.int64(0)))
    with pytest.raises(ValueError, match=re.escape(
        f"batchpart.partition_ffi_target('{ARG}') (its call to '{ARG}')") +
                       r".*result 1 \(the index\) has dtype float32"):
      bad.lower(x)
  finally:
    bp.unpartition(ARG)
  adopted = _arg_primitive("adopted")
  mlir.register_lowering(adopted, jax.ffi.ffi_lowering(ARG), platform="cpu")
  bp.partition_primitive(adopted, **decl)
  try:
    assert "$x:n=argmax:0.-1" in _lowered_text(adopted, x)
  finally:
    bp.unpartition(adopted)
  lowered = _arg_primitive("lowered")
  mlir.register_lowering(lowered, bp.ffi_lowering(ARG, **decl), platform="cpu")
  assert "$x:n=argmax:0.-1" in _lowered_text(lowered, x)


def _lowered_text(p, x) -> str:
  return jax.jit(lambda x: p.bind(x, op=np.int64(0))).lower(x).as_text()


def test_decorator_accepts_a_combiner():
  @bp.batch_partitionable(signature="(n)->(),()", reduce={"n": "argmin"})
  def f(x):
    return jax.ffi.ffi_call(ARG, (S(x.shape[:-1], x.dtype), S(x.shape[:-1], np.int32)))(
        x, op=np.int64(1))

  x = np.array([[4, 1, 1, 2], [0, 0, -3, 9]], np.float32)
  value, index = jax.jit(f)(x)
  np.testing.assert_array_equal(np.asarray(index), [1, 2])
  assert "$x:n=argmin:0.-1" in jax.jit(f).lower(x).as_text()


def test_callbacks_accept_a_combiner_and_io_callback_refuses_reduce():
  def lse(x):
    return np.logaddexp.reduce(x, axis=-1).astype(x.dtype)

  x = np.log(np.arange(1, 9, dtype=np.float32)).reshape(2, 4)
  out = jax.jit(lambda x: bp.pure_callback(lse, S((2,), np.float32), x, signature="(n)->()",
                                           reduce={"n": "logsumexp"}))(x)
  np.testing.assert_allclose(np.asarray(out), lse(x), rtol=1e-6)
  with pytest.raises(ValueError, match=r"batchpart\.pure_callback\(.*lse\).*result 0 "
                                       r"\(the value\) has dtype complex64"):
    bp.pure_callback(lse, (S((2,), np.complex64), S((2,), np.int32)), x,
                     signature="(n)->(),()", reduce={"n": "argmax"})
  with pytest.raises((TypeError, ValueError), match="reduce"):
    bp.io_callback(lse, S((2,), np.float32), x, signature="(n)->()",
                   reduce={"n": "logsumexp"})

  def package_lse(x):
    return jax.pure_callback(lse, S((2,), np.float32), x)

  bp.partition_callback(lse, signature="(n)->()", reduce={"n": "logsumexp"})
  np.testing.assert_allclose(np.asarray(jax.jit(package_lse)(x)), lse(x), rtol=1e-6)
