"""A two-process jax.distributed job (gloo, 4 CPU devices per process) with
a reduced dim split across the processes: each process supplies and
computes on its own rows of n only, and the all-reduce batchpart adds
leaves the global result on both, without any gather. A group that missed
the other process, or a combiner run over the wrong devices, would leave
each process its own partial result."""

import os

import numpy as np
import pytest

from batchpart import _hlo, testing as kernels

from helpers import replica_groups, run_two_processes

WORKER = os.path.join(os.path.dirname(__file__), "reductions_multiprocess_worker.py")
TARGET = "batchpart_test_reduce_rows"
B, N, K = 4, 64, 3


def _groups(text):
  """The replica groups of the program's one all-reduce."""
  (reduce,) = [c for c in _hlo.collectives(text) if c.opcode == "all-reduce"]
  return replica_groups(reduce)


@pytest.mark.timeout(300)
def test_each_process_reduces_its_own_rows_and_both_get_the_result(tmp_path):
  out = str(tmp_path / "results")
  run_two_processes(WORKER, out)
  rng = np.random.default_rng(0)
  x = rng.standard_normal((B, N, K)).astype(np.float32)
  w = rng.standard_normal((B, N)).astype(np.float32)
  scores = rng.integers(-9, 9, (B, N)).astype(np.float32)
  r = [np.load(f"{out}.{i}.npz") for i in range(2)]
  top_values, top_index = kernels.top_k_reference(scores, 5)
  for i in range(2):
    np.testing.assert_array_equal(r[i]["top_k_index"], top_index)
    np.testing.assert_array_equal(r[i]["top_k_values"], top_values)
    mine = list(range(N // 2 * i, N // 2 * (i + 1)))
    for mesh in ("flat", "grid"):
      assert list(r[i][f"{mesh}_supplied"]) == mine
      for op in ("sum", "max"):
        np.testing.assert_allclose(r[i][f"{mesh}_{op}"], kernels.reduce_rows_reference(x, w, op),
                                   rtol=1e-5, atol=1e-5)
        # Each of the process's 4 devices computed its own part, once.
        assert int(r[i][f"{mesh}_{op}_rows"]) == B * N // 2
    assert str(r[i]["flat_sum_spec"]) == "P()"
    assert str(r[i]["grid_sum_spec"]) in ("P('d',)", "P('d', None)")
  flat, grid = str(r[0]["flat_hlo"]), str(r[0]["grid_hlo"])
  (call,) = _hlo.custom_calls(flat, TARGET)
  assert [t.shape for t in call.operand_types] == [(B, N // 8, K), (B, N // 8)]
  (call,) = _hlo.custom_calls(grid, TARGET)
  assert [t.shape for t in call.operand_types] == [(B // 4, N // 2, K), (B // 4, N // 2)]
  for text in (flat, grid):
    assert {c.opcode for c in _hlo.collectives(text)} == {"all-reduce"}
  assert _groups(flat) == {frozenset(range(8))}
  # n on the process axis: each group pairs a device with its peer in the other process.
  assert _groups(grid) == {frozenset({d, d + 4}) for d in range(4)}
