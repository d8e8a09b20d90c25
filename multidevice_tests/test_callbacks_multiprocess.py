"""A two-process jax.distributed job (gloo, 4 CPU devices per process):
each process's host callbacks get that process's batch shards only, and
the results are ordinary sharded arrays; so are a package's own
jax.pure_callback's once declared with bp.partition_callback, and
bp.buffer_callback's in-place writes."""

import os

import numpy as np
import pytest

from batchpart import _hlo

from helpers import run_two_processes

WORKER = os.path.join(os.path.dirname(__file__), "callbacks_multiprocess_worker.py")


@pytest.mark.timeout(300)
def test_each_process_calls_back_for_its_own_shards(tmp_path):
  out = str(tmp_path / "results")
  run_two_processes(WORKER, out)
  m = np.random.default_rng(1).standard_normal((32, 6, 6))
  x = (m + np.swapaxes(m, -1, -2)).astype(np.float32)
  want = np.linalg.eigvalsh(x)
  r = [np.load(f"{out}.{i}.npz") for i in range(2)]
  for i in range(2):
    np.testing.assert_allclose(r[i]["w"], want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(r[i]["total"], want.sum(), rtol=1e-4)
    # Process i holds devices 4i..4i+3, i.e. rows 16i..16i+15, three runs.
    mine = list(range(16 * i, 16 * i + 16))
    assert list(r[i]["pure_rows"]) == sorted(mine * 3)
    assert list(r[i]["io_rows"]) == sorted(mine * 3)
    np.testing.assert_array_equal(r[i]["who"], np.repeat([0, 1], 16))
    np.testing.assert_allclose(r[i]["package_w"], want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(r[i]["package_total"], want.sum(), rtol=1e-4)
    # One call per local device, on that device's 4 rows of this process.
    assert list(r[i]["package_block_rows"]) == [4] * 4
    np.testing.assert_array_equal(r[i]["package_firsts"], np.sort(x[mine, 0, 0]))
    np.testing.assert_allclose(r[i]["buffer_w"], want, rtol=1e-4, atol=1e-4)
    assert list(r[i]["buffer_rows"]) == mine   # in place, this process's rows once
  text = str(r[0]["hlo"])
  calls = _hlo.custom_calls(text, "xla_ffi_python_cpu_callback")
  assert len(calls) == 2
  assert all([t.shape for t in c.operand_types] == [(2,), (4, 6, 6)] for c in calls)
