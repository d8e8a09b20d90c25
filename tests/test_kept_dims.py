"""Results that keep a reduced dim, on one device: the signature records
which results keep it, the derived name carries them and reads back, the
combining checks skip them, the decorator follows them to its calls, and a
result that keeps some reduced dims but not all is refused. (Eight devices:
multidevice_tests/test_kept_dims.py.)"""

import jax
import numpy as np
import pytest

import batchpart as bp
from batchpart import testing as kernels
from batchpart._frontend.signature import parse_signature
from batchpart._vocab import derived_names
from batchpart._vocab.description import CallDescription
from batchpart._vocab.dims.reduced import Reduction

S = jax.ShapeDtypeStruct


def test_the_signature_records_the_results_that_keep_the_dim():
  sig = parse_signature("(n,k),(n)->(k),(n),(...,n,2)", owner="t")
  (r,) = sig.reductions({"n": "sum"}, owner="t")
  assert r.dims == ((0, -2), (1, -1)) and r.results == ((1, -1), (2, -2))


def test_derived_names_carry_the_kept_results_and_read_back():
  d = CallDescription("k", (1, 1), (1, 1), ((2, 1, 0), (1, 0)), ((1, 0), (1, 0)),
                      reductions=(Reduction("n", "sum", ((0, -2), (1, -1)), ((1, -1),)),))
  name = derived_names.encode(d)
  assert name.endswith("$x:n=sum:0.-2,1.-1:r1.-1")
  assert derived_names.decode(name) == d


def test_a_description_refuses_a_kept_axis_the_result_lacks():
  with pytest.raises(ValueError, match="result 1 has no core axis -2"):
    CallDescription("k", (1, 1), (1, 1), ((2, 1, 0), (1, 0)), ((1, 0), (1, 0)),
                    reductions=(Reduction("n", "sum", ((0, -2),), ((1, -2),)),))


def test_combiner_checks_skip_the_kept_results():
  x = np.arange(8, dtype=np.float32).reshape(2, 4)
  # (values, indices) combine by max_k; the third result keeps n.
  bp.ffi_call("batchpart_test_top_k_rows", [S((2, 2), np.float32), S((2, 2), np.int32),
                                            S((2, 4), np.float32)],
              signature="(n)->(k),(k),(n)", reduce={"n": "max_k"})
  total, row = jax.jit(kernels.weigh_rows)(x[..., None] * np.ones(3, np.float32), x)
  np.testing.assert_allclose(np.asarray(row), 3 * x * x)
  np.testing.assert_allclose(np.asarray(total), np.repeat((x * x).sum(-1)[:, None], 3, -1))


def test_the_decorator_declares_the_call_that_keeps_the_dim():
  """The wrapper's result that keeps n walks back to the call's: its derived
  name keeps n in result 1."""
  @bp.batch_partitionable(signature="(n,k),(n)->(k),(n)", reduce={"n": "sum"})
  def weigh(x, w):
    out = (S((*x.shape[:-2], x.shape[-1]), x.dtype), S(x.shape[:-1], x.dtype))
    return jax.ffi.ffi_call("batchpart_test_weigh_rows", out)(x, w)

  x = np.arange(24, dtype=np.float32).reshape(2, 4, 3)
  w = np.ones((2, 4), np.float32)
  assert "$x:n=sum:0.-2,1.-1:r1.-1" in jax.jit(weigh).lower(x, w).as_text()
  total, row = jax.jit(weigh)(x, w)
  np.testing.assert_allclose(np.asarray(row), x.sum(-1))
  np.testing.assert_allclose(np.asarray(total), x.sum(1))


def test_a_result_that_keeps_some_reduced_dims_but_not_all_is_refused():
  """Such a result would need combining over the dims it lacks while split
  along the others."""
  with pytest.raises(ValueError, match=r"batchpart\.ffi_call\('k'\): result 1 keeps the "
                                       r"reduced dim\(s\) n but not m; a result keeps every "
                                       "reduced dim or none"):
    bp.ffi_call("k", [S((2,), np.float32), S((2, 4), np.float32)],
                signature="(n,m)->(),(n)", reduce={"n": "sum", "m": "sum"})


def test_the_shardy_rule_shares_the_factor_with_the_kept_result():
  from batchpart._partition import sharding_rule
  r = Reduction("n", "sum", ((0, -2), (1, -1)), ((1, -1),))
  lhs, rhs, replicated, reduction = sharding_rule.factors(
      [(4, 64, 3), (4, 64)], [2, 1], [(4, 3), (4, 64)], [1, 1], (4,), reductions=(r,))
  assert sharding_rule.text(lhs, rhs) == "b0 x0 o0_2, b0 x0 -> b0 r0_1, b0 x0"
  assert reduction == () and "x0" not in replicated
