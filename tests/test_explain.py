"""bp.explain on one device. Its steps have tests of their own
(test_explain_*.py, test_hlo.py, test_stablehlo.py); the multi-device
behaviour is in multidevice_tests/test_explain.py."""

import jax
import jax.numpy as jnp
import numpy as np

import batchpart as bp
from batchpart import testing as kernels


def test_single_device_call():
  x = np.ones((6, 5), np.float32)
  report = bp.explain(lambda x: kernels.softmax(x), x)
  assert report.num_devices == 1
  (call,) = report.calls
  assert call.target == "batchpart_test_softmax" and call.num_batch_dims == 1
  assert call.global_operand_shapes == call.device_operand_shapes == ((6, 5),)
  assert call.global_result_shapes == call.device_result_shapes == ((6, 5), (6,))
  assert call.collectives_before == call.collectives_after == ()
  assert call.replication == 1
  assert "test_explain.py" in call.source
  text = str(report)
  assert "batchpart_test_softmax" in text and "f32[6,5]" in text


def test_explain_does_not_run_the_function():
  kernels.reset_batch_elements_processed()
  bp.explain(kernels.softmax, np.ones((6, 5), np.float32))
  assert kernels.batch_elements_processed() == 0


def test_no_ffi_call():
  report = bp.explain(lambda x: jnp.cos(x) * 2, np.ones(3, np.float32))
  assert report.calls == ()
  assert "no FFI call" in str(report)


def test_keyword_arguments_go_to_the_function():
  f = lambda x, *, scale: kernels.softmax(x * scale)[0]
  (call,) = bp.explain(f, np.ones((2, 3), np.float32), scale=2.0).calls
  assert call.global_operand_shapes == ((2, 3),)


def test_vmap_adds_a_batch_dim():
  (call,) = bp.explain(jax.vmap(kernels.softmax), np.ones((2, 3, 4), np.float32)).calls
  assert call.num_batch_dims == 2 and call.global_operand_shapes == ((2, 3, 4),)
