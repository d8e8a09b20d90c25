"""One process of a two-process jax.distributed job (4 CPU devices each)
calling a reduced batchpart call whose reduced dim n is split across the
processes.

Run by test_reductions_multiprocess.py as ``python
reductions_multiprocess_worker.py PORT ID OUT``. Each process builds the
global operands from its own rows of n only (the rows it is asked for are
recorded), runs ``reduce_rows`` with n reduced on two meshes, and writes, to
OUT.<ID>.npz, the result as its own devices hold it (no gather), the rows it
supplied, the rows its kernels processed and the compiled program; then a
max_k over n split across the processes, and the result it holds.
"""

import sys

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import batchpart.testing as kernels

from helpers import join_two_processes

process_id, out, devices = join_two_processes(sys.argv)
# Devices in process order: process 0 holds mesh rows 0-3 of the flat mesh
# and row 0 of the 2x4 one.
flat = Mesh(np.array(devices), ("x",))
grid = Mesh(np.array(devices).reshape(2, 4), ("p", "d"))
B, N, K = 4, 64, 3
rng = np.random.default_rng(0)
x = rng.standard_normal((B, N, K)).astype(np.float32)
w = rng.standard_normal((B, N)).astype(np.float32)


def global_array(value, sharding, supplied):
  """The global array, built from the blocks this process's devices hold;
  records the rows of n (dim 1) it supplied."""
  def block(index):
    rows = range(N)[index[1]]
    supplied.update(rows)
    return value[index]
  return jax.make_array_from_callback(value.shape, sharding, block)


results = {}
for name, mesh, spec in (("flat", flat, P(None, "x")), ("grid", grid, P("d", "p"))):
  supplied: set = set()
  xs = global_array(x, NamedSharding(mesh, P(*spec, None)), supplied)
  ws = global_array(w, NamedSharding(mesh, spec), supplied)
  for op in ("sum", "max"):
    f = jax.jit(lambda x, w, op=op: kernels.reduce_rows(x, w, op))
    compiled = f.lower(xs, ws).compile()
    kernels.reset_batch_elements_processed()
    y = jax.block_until_ready(compiled(xs, ws))
    results[f"{name}_{op}_rows"] = np.array(kernels.batch_elements_processed())
    # This process's devices alone hold the whole result: replicated over n's
    # axis, which spans both processes.
    shards = sorted(y.addressable_shards, key=lambda s: s.index[0].start or 0)
    seen = {}
    for s in shards:
      seen[s.index[0].start or 0] = np.asarray(s.data)
    results[f"{name}_{op}"] = np.concatenate([seen[k] for k in sorted(seen)])
    results[f"{name}_{op}_spec"] = np.array(str(y.sharding.spec))
    results[f"{name}_hlo"] = np.array(compiled.as_text())
  results[f"{name}_supplied"] = np.array(sorted(supplied))
# max_k with n split across the processes: the all-gather of candidates
# crosses them; each process saves the whole (replicated) result it holds.
scores = rng.integers(-9, 9, (B, N)).astype(np.float32)
values, index = jax.jit(lambda x: kernels.top_k_rows(x, 5))(
    global_array(scores, NamedSharding(flat, P(None, "x")), set()))
results["top_k_values"] = np.asarray(values.addressable_shards[0].data)
results["top_k_index"] = np.asarray(index.addressable_shards[0].data)
np.savez(f"{out}.{process_id}.npz", **results)
jax.distributed.shutdown()
