"""batchpart's own test kernels, registered for the tests and the demo.

Each kernel counts the batch elements it processes, so a test can prove that
no device recomputes another's share: after one sharded call the count equals
the batch size, not the batch size times the number of devices.
"""

from __future__ import annotations

import jax
import numpy as np

import batchpart
from batchpart import _core

#: target name -> short kernel name in batchpart._core.testing.handlers()
TARGETS = {
    "batchpart_test_softmax": "softmax",      # (n) -> (n), ()
    "batchpart_test_matvec": "matvec",        # (m,n),(n) -> (m); attr alpha: f64
    "batchpart_test_axpy": "axpy",            # (n),(n) -> (n); attr alpha: f64
    "batchpart_test_copy_bytes": "copy_bytes",  # (m,n) -> (m,n), memory as laid out
}


def register() -> None:
  """Registers the test kernels (idempotent) and marks them batch partitionable."""
  handlers = _core.testing.handlers()
  for target, short in TARGETS.items():
    batchpart.register_ffi_target(target, handlers[short], platform="cpu")


def batch_elements_processed() -> int:
  return _core.testing.batch_elements_processed()


def reset_batch_elements_processed() -> None:
  _core.testing.reset_batch_elements_processed()


def softmax(x):
  """Row-wise softmax and log-sum-exp over the last dim."""
  return batchpart.ffi_call(
      "batchpart_test_softmax",
      (jax.ShapeDtypeStruct(x.shape, x.dtype),
       jax.ShapeDtypeStruct(x.shape[:-1], x.dtype)),
      signature="(n)->(n),()")(x)


def matvec(a, x, *, alpha: float = 1.0):
  """alpha * A @ x with broadcast batch dims."""
  batch = np.broadcast_shapes(a.shape[:-2], x.shape[:-1])
  return batchpart.ffi_call(
      "batchpart_test_matvec",
      jax.ShapeDtypeStruct((*batch, a.shape[-2]), a.dtype),
      signature="(m,n),(n)->(m)")(a, x, alpha=np.float64(alpha))


def softmax_reference(x):
  x = np.asarray(x)
  m = x.max(axis=-1, keepdims=True)
  e = np.exp(x - m)
  s = e.sum(axis=-1, keepdims=True)
  return e / s, (m + np.log(s))[..., 0]
