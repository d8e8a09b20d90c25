"""A two-process jax.distributed job on this machine (gloo collectives, 4
CPU devices per process) gives the single-process results."""

import os

import numpy as np
import pytest

from batchpart import _hlo, testing as kernels

from helpers import run_two_processes

WORKER = os.path.join(os.path.dirname(__file__), "multiprocess_worker.py")


@pytest.mark.timeout(300)
def test_two_processes_match_one(tmp_path):
  out = str(tmp_path / "results.npz")
  run_two_processes(WORKER, out)
  r = np.load(out)
  x = np.random.default_rng(0).standard_normal((64, 16)).astype(np.float32)
  want_y, want_lse = kernels.softmax_reference(x)
  m = np.random.default_rng(1).standard_normal((32, 8, 8))
  want_c = np.linalg.cholesky(m @ np.swapaxes(m, -1, -2) + 8 * np.eye(8))
  for spec in ("batch", "core"):
    np.testing.assert_allclose(r[f"softmax_{spec}"], want_y, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(r[f"lse_{spec}"], want_lse, rtol=1e-5)
    np.testing.assert_allclose(r[f"cholesky_{spec}"], want_c, rtol=1e-5, atol=1e-5)
  # Each device runs the kernel on its own 8 rows, across both processes.
  for spec in ("batch", "core"):
    (call,) = _hlo.custom_calls(str(r[f"hlo_{spec}"]), "batchpart_test_softmax")
    assert [t.shape for t in call.operand_types] == [(8, 16)]
  assert not _hlo.collectives(str(r["hlo_batch"]))
