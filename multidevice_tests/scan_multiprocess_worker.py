"""One process of a two-process jax.distributed job (4 CPU devices each)
calling scan kernels whose scanned dim t is split over all 8 devices, across
both processes.

Run by test_scan_multiprocess.py as ``python scan_multiprocess_worker.py
PORT ID OUT``. Each process builds the global operands from its own parts of
t only, then, under Shardy and under GSPMD, runs the parallel linear
recurrence (its summaries all-gathered across the processes), the sequential
tanh RNN (its state handed from process 0's last device to process 1's first)
and the reversed int32 prefix sum (the state flowing from process 1 back to
process 0). It writes, to OUT.<ID>.npz, each of its devices' part of the
per-step result (where it starts in t, and its values), the final state as
its own devices hold it (no gather: replicated over t's axis, which spans
both processes) and the compiled program.
"""

import sys

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from test_scan_multiprocess import operands

import batchpart as bp
import batchpart.testing as bt

from helpers import join_two_processes

process_id, out, devices = join_two_processes(sys.argv)
mesh = Mesh(np.array(devices), ("x",))
S = jax.ShapeDtypeStruct
# The operands, the same in both processes and in the test that checks them.
a, x, h0, rx, rh0, v, s0 = operands()
B, T = a.shape

supplied: dict = {}


def sequence(value, name):
  """The global array with t (last dim) split 8 ways, built from the parts
  this process's devices hold; records the steps of t it supplied under
  ``name``."""
  def block(index):
    supplied.setdefault(name, set()).update(range(value.shape[-1])[index[-1]])
    return value[index]
  return jax.make_array_from_callback(value.shape, NamedSharding(mesh, P(None, "x")), block)


def replicated(value):
  return jax.make_array_from_callback(value.shape, NamedSharding(mesh, P()),
                                      lambda index: value[index])


linear = bt.linear_scan((B, T), np.float32)
rnn = bp.ffi_call("batchpart_test_tanh_rnn", (S(rx.shape, np.float32), S((3,), np.float32)),
                  signature="(t),()->(t),()", scan={"t": bp.Scan((1, 1))})
suffix = bp.ffi_call("batchpart_test_prefix_sum", (S((B, T), np.int32), S((B,), np.int32)),
                     signature="(t),()->(t),()",
                     scan={"t": bp.Scan((1, 1), merge=bt.add_merge, reverse=True)})
programs = {
    "linear": (lambda a, x, h: linear(a, x, h, reverse=np.int64(0)),
               (sequence(a, "linear"), sequence(x, "linear"), replicated(h0))),
    "rnn": (lambda x, h: rnn(x, h, w=0.9, reverse=np.int64(0)),
            (sequence(rx, "rnn"), replicated(rh0))),
    "suffix": (lambda v, s: suffix(v, s, reverse=np.int64(1)),
               (sequence(v, "suffix"), replicated(s0))),
}

results = {f"{name}_supplied": np.array(sorted(steps)) for name, steps in supplied.items()}
for partitioner in ("shardy", "gspmd"):
  jax.config.update("jax_use_shardy_partitioner", partitioner == "shardy")
  for name, (fn, args) in programs.items():
    key = f"{partitioner}_{name}"
    compiled = jax.jit(fn).lower(*args).compile()
    y, final, *rest = jax.block_until_ready(compiled(*args))
    parts = sorted((s.index[-1].start or 0, np.asarray(s.data)) for s in y.addressable_shards)
    results[f"{key}_starts"] = np.array([p[0] for p in parts])
    results[f"{key}_y"] = np.stack([p[1] for p in parts])
    results[f"{key}_y_spec"] = np.array(str(y.sharding.spec))
    # Every device of this process holds the whole final state (and the
    # linear recurrence's prod a): each must hold the same values.
    for i, r in enumerate((final, *rest)):
      held = [np.asarray(s.data) for s in r.addressable_shards]
      assert all(np.array_equal(h, held[0]) for h in held), (key, i, held)
      results[f"{key}_summary{i}"] = held[0]
    results[f"{key}_hlo"] = np.array(compiled.as_text())
np.savez(f"{out}.{process_id}.npz", **results)
jax.distributed.shutdown()
