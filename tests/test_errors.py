"""Bad input raises a Python exception naming the target
and the offending argument; nothing crashes, nothing is silently wrong."""

import jax
import numpy as np
import pytest

import batchpart as bp
from batchpart import _core

SOFTMAX = "batchpart_test_softmax"
MATVEC = "batchpart_test_matvec"
f32 = np.float32


def sds(*shape):
  return jax.ShapeDtypeStruct(shape, f32)


def test_num_batch_dims_above_operand_rank():
  x = np.ones((4, 8), f32)
  with pytest.raises(ValueError, match=rf"{SOFTMAX}.*num_batch_dims=3.*operand 0.*\(4, 8\)"):
    bp.ffi_call(SOFTMAX, (sds(4, 8), sds(4)), num_batch_dims=3)(x)


@pytest.mark.parametrize("kwargs", [{}, {"num_batch_dims": 1, "signature": "(n)->(n),()"}])
def test_both_or_neither_spec(kwargs):
  with pytest.raises(ValueError, match=rf"{SOFTMAX}.*exactly one of num_batch_dims and signature"):
    bp.ffi_call(SOFTMAX, (sds(4, 8), sds(4)), **kwargs)


def test_operand_rank_below_core_rank():
  with pytest.raises(ValueError, match=rf"{MATVEC}.*operand 0 has shape \(3,\).*core dims"):
    bp.ffi_call(MATVEC, sds(3), signature="(m,n),(n)->(m)")(np.ones(3, f32), np.ones(3, f32),
                                                            alpha=1.0)


def test_batch_shapes_do_not_broadcast():
  a, v = np.ones((4, 3, 5), f32), np.ones((6, 5), f32)
  with pytest.raises(ValueError,
                     match=rf"{MATVEC}.*batch shape \(6,\) of operand 1 does not broadcast"):
    bp.ffi_call(MATVEC, sds(4, 3), signature="(m,n),(n)->(m)")(a, v, alpha=1.0)


def test_core_dims_disagree_with_signature():
  a, v = np.ones((4, 3, 5), f32), np.ones((4, 6), f32)
  with pytest.raises(ValueError, match=rf"{MATVEC}.*core dim 'n' of operand 1.*size 6.*5"):
    bp.ffi_call(MATVEC, sds(4, 3), signature="(m,n),(n)->(m)")(a, v, alpha=1.0)


def test_result_core_dim_disagrees():
  a, v = np.ones((4, 3, 5), f32), np.ones((4, 5), f32)
  with pytest.raises(ValueError, match=rf"{MATVEC}.*core dim 'm' of result 0.*size 7"):
    bp.ffi_call(MATVEC, sds(4, 7), signature="(m,n),(n)->(m)")(a, v, alpha=1.0)


def test_result_batch_shape_disagrees():
  x = np.ones((4, 8), f32)
  with pytest.raises(ValueError, match=rf"{SOFTMAX}.*result 1.*\(5,\)"):
    bp.ffi_call(SOFTMAX, (sds(4, 8), sds(5)), signature="(n)->(n),()")(x)


def test_num_batch_dims_with_unequal_batch_shapes():
  with pytest.raises(ValueError, match=rf"{MATVEC}.*same leading 1 dims.*operand 1"):
    bp.ffi_call(MATVEC, sds(4, 3), num_batch_dims=1)(np.ones((4, 3, 5), f32),
                                                     np.ones((2, 5), f32), alpha=1.0)


@pytest.mark.parametrize("signature", ["(n)(n)->(n)", "n->n", "(n->(n)", 3])
def test_malformed_signature(signature):
  with pytest.raises(ValueError, match=rf"{SOFTMAX}.*is not a gufunc signature"):
    bp.ffi_call(SOFTMAX, sds(4), signature=signature)


def test_signature_arity_mismatch():
  with pytest.raises(ValueError, match=rf"{SOFTMAX}.*names 2 operands but the call got 1"):
    bp.ffi_call(SOFTMAX, sds(4, 8), signature="(n),(n)->(n)")(np.ones((4, 8), f32))


@pytest.mark.parametrize("k", [-1, 1.5, True, "1"])
def test_num_batch_dims_must_be_a_non_negative_int(k):
  with pytest.raises(ValueError, match=rf"{SOFTMAX}.*non-negative int"):
    bp.ffi_call(SOFTMAX, (sds(4, 8), sds(4)), num_batch_dims=k)(np.ones((4, 8), f32))


def test_alias_with_different_shapes():
  with pytest.raises(ValueError, match=r"batchpart_test_axpy.*input_output_aliases.*operand 0"):
    bp.ffi_call("batchpart_test_axpy", sds(4, 8), num_batch_dims=1,
                input_output_aliases={0: 0})(np.ones((4, 9), f32), np.ones((4, 8), f32),
                                             alpha=1.0)


def test_bad_layout():
  with pytest.raises(ValueError, match=r"batchpart_test_copy_bytes.*input layout 0.*permutation"):
    bp.ffi_call("batchpart_test_copy_bytes", sds(4, 8, 8), num_batch_dims=1,
                input_layouts=[(0, 1, 1)])(np.ones((4, 8, 8), f32))


def test_reregistering_with_a_different_handler():
  handlers = _core.testing.handlers()
  bp.register_ffi_target("errors_test_target", handlers["softmax"])
  bp.register_ffi_target("errors_test_target", _core.testing.handlers()["softmax"])  # same fn
  with pytest.raises(ValueError, match=r"'errors_test_target' is already registered"):
    bp.register_ffi_target("errors_test_target", handlers["matvec"])


@pytest.mark.parametrize("name", ["", None, 3])
def test_bad_target_names(name):
  with pytest.raises(TypeError, match="non-empty str"):
    bp.register_ffi_target(name, _core.testing.handlers()["softmax"])
  with pytest.raises(TypeError, match="non-empty str"):
    bp.mark_batch_partitionable(name)


def test_kernel_error_is_a_python_exception():
  """A kernel's own shape check surfaces as an exception, not an abort."""
  # copy_bytes needs rank >= 2; num_batch_dims=0 on a vector reaches the kernel.
  with pytest.raises(Exception, match="copy_bytes"):
    jax.block_until_ready(bp.ffi_call("batchpart_test_copy_bytes", sds(8), num_batch_dims=0)(
        np.ones(8, f32)))


def test_decorator_requires_one_spec():
  with pytest.raises(ValueError, match="exactly one of"):
    bp.batch_partitionable(lambda x: x)


def test_decorator_checks_its_arguments():
  @bp.batch_partitionable(signature="(n,n)->(n,n)")
  def square(x):
    return x
  with pytest.raises(ValueError, match=r"square.*core dim 'n' of operand 0"):
    square(np.ones((4, 3, 5), f32))
