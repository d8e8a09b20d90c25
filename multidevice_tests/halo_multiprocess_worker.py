"""One process of a two-process jax.distributed job (4 CPU devices each)
calling a halo stencil whose halo dim n is split across the processes.

Run by test_halo_multiprocess.py as ``python halo_multiprocess_worker.py
PORT ID OUT``. Each process builds the global operand from its own elements
of n only, runs the stencil (lo 2, hi 1, reflect) with n split 8 ways, its
rule unstated and stated (``ends="reflect"``), and writes, to OUT.<ID>.npz,
each of its devices' part of the results (where it starts in n, and its
values) and the compiled program.
"""

import sys

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import batchpart as bp
import batchpart.testing as kernels

from helpers import join_two_processes

process_id, out, devices = join_two_processes(sys.argv)
mesh = Mesh(np.array(devices), ("x",))
x = np.random.default_rng(0).standard_normal((2, 64)).astype(np.float32)
sharding = NamedSharding(mesh, P(None, "x"))
xs = jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])
attrs = dict(rank=np.int64(1), lo=np.int64(2), hi=np.int64(1),
             mode=np.int64(kernels.HALO_MODES["reflect"]))
stencil = lambda x, ends: bp.ffi_call(
    "batchpart_test_stencil", jax.ShapeDtypeStruct(x.shape, x.dtype), signature="(n)->(n)",
    halo={"n": bp.Halo(2, 1, ends=ends)})(x, **attrs)
f = jax.jit(lambda x: (stencil(x, None), stencil(x, "reflect")))
compiled = f.lower(xs).compile()
results = jax.block_until_ready(compiled(xs))
parts = [sorted((s.index[1].start or 0, np.asarray(s.data)) for s in y.addressable_shards)
         for y in results]
np.savez(f"{out}.{process_id}.npz", starts=np.array([p[0] for p in parts[0]]),
         values=np.stack([p[1] for p in parts[0]]),
         values_ends=np.stack([p[1] for p in parts[1]]), hlo=np.array(compiled.as_text()))
jax.distributed.shutdown()
