"""One process of a two-process jax.distributed job (4 CPU devices each).

Run by test_multiprocess.py as ``python multiprocess_worker.py PORT ID OUT``:
batch-sharded and core-sharded batchpart calls over all 8 devices of the
job; process 0 writes the gathered results to OUT (.npz).
"""

import os
import sys

port, process_id, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=process_id,
                           initialization_timeout=120)

import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P  # noqa: E402

import batchpart as bp  # noqa: E402
import batchpart.testing as kernels  # noqa: E402

kernels.register()
assert jax.device_count() == 8 and jax.local_device_count() == 4
mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))
x = np.random.default_rng(0).standard_normal((64, 16)).astype(np.float32)
m = np.random.default_rng(1).standard_normal((32, 8, 8))
spd = (m @ np.swapaxes(m, -1, -2) + 8 * np.eye(8)).astype(np.float32)


def global_array(value, spec):
  sharding = NamedSharding(mesh, spec)
  return jax.make_array_from_callback(value.shape, sharding, lambda idx: value[idx])


results = {}
for spec_name, spec in (("batch", P("x")), ("core", P(None, "x"))):
  y, lse = jax.jit(kernels.softmax)(global_array(x, spec))
  results[f"softmax_{spec_name}"] = multihost_utils.process_allgather(y, tiled=True)
  results[f"lse_{spec_name}"] = multihost_utils.process_allgather(lse, tiled=True)
  text = jax.jit(kernels.softmax).lower(global_array(x, spec)).compile().as_text()
  results[f"hlo_{spec_name}"] = np.array(text)
for spec_name, spec in (("batch", P("x")), ("core", P(None, "x"))):
  c = jax.jit(bp.linalg.cholesky)(global_array(spd, spec))
  results[f"cholesky_{spec_name}"] = multihost_utils.process_allgather(c, tiled=True)
if process_id == 0:
  np.savez(out, **results)
jax.distributed.shutdown()
