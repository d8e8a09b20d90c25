"""A two-process jax.distributed job (gloo, 4 CPU devices per process) with a
scanned dim t split over all 8 devices, so over both processes, under Shardy
and GSPMD: the parallel linear recurrence (the all-gather of the parts'
summaries crosses the processes), the sequential tanh RNN (the state is handed
across the process boundary) and the reversed int32 prefix sum (the state
flows from the last process back to the first). Each process's parts and the
final state it holds equal NumPy's: integers bit for bit, floats within the
fold's reassociation (2e-5 relative); each process supplied only its own part
of the sequence, and no program gathers the sequence."""

import os
import re

import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from batchpart import _hlo

from helpers import replica_groups, run_two_processes

WORKER = os.path.join(os.path.dirname(__file__), "scan_multiprocess_worker.py")
B, T = 4, 64


def operands():
  """The worker's operands, drawn in its order from its seed."""
  rng = np.random.default_rng(0)
  a = rng.uniform(0.8, 1.0, (B, T)).astype(np.float32)
  x = rng.standard_normal((B, T)).astype(np.float32)
  h0 = rng.standard_normal(B).astype(np.float32)
  rx = rng.standard_normal((3, 40)).astype(np.float32)
  rh0 = rng.standard_normal(3).astype(np.float32)
  v = rng.integers(-2**30, 2**30, (B, T)).astype(np.int32)
  s0 = rng.integers(-2**30, 2**30, B).astype(np.int32)
  return a, x, h0, rx, rh0, v, s0


def references():
  """name -> (per-step result, summary results) in NumPy: the recurrences in
  float64, the suffix sum in wrapping int32."""
  a, x, h0, rx, rh0, v, s0 = operands()
  y, h = np.zeros((B, T)), h0.astype(np.float64)
  for i in range(T):
    h = a[:, i] * h + x[:, i]
    y[:, i] = h
  linear = (y, [h, np.prod(a.astype(np.float64), axis=-1)])
  ry, r = np.zeros(rx.shape, np.float32), rh0.copy()
  for i in range(rx.shape[-1]):
    r = np.tanh(np.float32(0.9) * r + rx[:, i]).astype(np.float32)
    ry[:, i] = r
  with np.errstate(over="ignore"):
    sy = (np.cumsum(v[:, ::-1], -1, dtype=np.int32)[:, ::-1] + s0[:, None]).astype(np.int32)
    total = (s0 + v.sum(-1, dtype=np.int32)).astype(np.int32)
  return {"linear": linear, "rnn": (ry, [r]), "suffix": (sy, [total])}


def check(got, want):
  if np.issubdtype(got.dtype, np.integer):
    np.testing.assert_array_equal(got, want)
  else:
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


@pytest.mark.timeout(300)
def test_scans_cross_the_processes(tmp_path):
  out = str(tmp_path / "results")
  run_two_processes(WORKER, out)
  want = references()
  for i in range(2):
    r = np.load(f"{out}.{i}.npz")
    for partitioner in ("shardy", "gspmd"):
      for name, (y, summaries) in want.items():
        key = f"{partitioner}_{name}"
        part = y.shape[-1] // 8
        # Each process supplied only the steps its own devices hold (the
        # sequence itself never crossed), and holds the parts of them.
        half = range(part * 4 * i, part * 4 * (i + 1))
        assert list(r[f"{name}_supplied"]) == list(half), name
        assert list(r[f"{key}_starts"]) == list(half[::part]), key
        assert str(r[f"{key}_y_spec"]) == str(P(None, "x")), key
        for start, got in zip(r[f"{key}_starts"], r[f"{key}_y"]):
          check(got, y[:, start:start + part])
        for k, s in enumerate(summaries):
          check(r[f"{key}_summary{k}"], s)
        text = str(r[f"{key}_hlo"])
        kinds = _hlo.collectives(text)
        assert all(f"[{y.shape[0]},{y.shape[1]}]" not in c.text for c in kinds), (key, kinds)
        if name == "rnn":
          # Sequential: 7 hand-offs of the 3-element state, part k to part
          # k + 1, the one from device 3 to 4 crossing the processes; what is
          # gathered at most is the parts' final states (to replicate the
          # last one's), never a step of the sequence.
          permutes = [c for c in kinds if c.opcode == "collective-permute"]
          assert len(permutes) == 7 and all("[3]" in c.text for c in permutes), (key, kinds)
          pairs = sorted(tuple(map(int, re.search(r"source_target_pairs=\{\{(\d+),(\d+)\}\}",
                                                  c.text).groups())) for c in permutes)
          assert pairs == [(k, k + 1) for k in range(7)], (key, pairs)
          gathers = [c for c in kinds if c.opcode == "all-gather"]
          assert all(re.search(r"f32\[8,3\]", c.text) for c in gathers), (key, gathers)
        else:
          # Parallel: one all-gather, of the 8 parts' summaries (4 elements
          # each), the one collective crossing the processes.
          gathers = [c for c in kinds if c.opcode == "all-gather"]
          assert len(gathers) == 1 and re.search(r"\[8,4\]", gathers[0].text), (key, kinds)
          assert replica_groups(gathers[0]) == {frozenset(range(8))}, (key, gathers)
