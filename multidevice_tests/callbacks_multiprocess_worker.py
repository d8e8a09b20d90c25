"""One process of a two-process jax.distributed job (4 CPU devices each)
calling bp.pure_callback and bp.io_callback on a batch sharded over all 8
devices, then a collective; and a package's own jax.pure_callback made per
shard by bp.partition_callback, and bp.buffer_callback writing each
device's rows in place.

Run by test_callbacks_multiprocess.py as ``python
callbacks_multiprocess_worker.py PORT ID OUT``: each process writes, to
OUT.<ID>.npz, the batch rows its own callbacks got and the gathered
results.
"""

import os
import sys
import threading

port, process_id, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=process_id,
                           initialization_timeout=120)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P  # noqa: E402

import batchpart as bp  # noqa: E402

assert jax.device_count() == 8 and jax.local_device_count() == 4
mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))
m = np.random.default_rng(1).standard_normal((32, 6, 6))
x = (m + np.swapaxes(m, -1, -2)).astype(np.float32)
lock = threading.Lock()
pure_rows, io_rows = [], []


def eig(block, index):
  with lock:
    pure_rows.extend(range(index[0].start, index[0].stop))
  return np.linalg.eigvalsh(block)


def write(block, index):
  with lock:
    io_rows.extend(range(index[0].start, index[0].stop))
  return np.full(block.shape[:1], jax.process_index(), np.int32)


@jax.jit
def f(x):
  w = bp.pure_callback(eig, jax.ShapeDtypeStruct((32, 6), np.float32), x,
                       num_batch_dims=1, with_index=True)
  who = bp.io_callback(write, jax.ShapeDtypeStruct((32,), np.int32), x,
                       num_batch_dims=1, with_index=True)
  return w, who, jnp.sum(w)


sharding = NamedSharding(mesh, P("x"))
xs = jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx])
for _ in range(3):
  w, who, total = f(xs)
assert w.sharding.spec == P("x") and who.sharding.spec == P("x")
text = f.lower(xs).compile().as_text()

package_blocks = []


def package_eig(block):
  """A package's callback: jax's calling convention, no index."""
  with lock:
    package_blocks.append(np.asarray(block)[:, 0, 0].copy())
  return np.linalg.eigvalsh(block)


@jax.jit
def package(x):
  w = jax.pure_callback(package_eig, jax.ShapeDtypeStruct((32, 6), np.float32), x,
                        vmap_method="expand_dims")
  return w, jnp.sum(w)


buffer_rows = []


def eig_into(ctx, out, block, index):
  """bp.buffer_callback's function: this device's rows, written in place."""
  with lock:
    buffer_rows.extend(range(index[0].start, index[0].stop))
  np.asarray(out)[...] = np.linalg.eigvalsh(np.asarray(block))


in_place = jax.jit(bp.buffer_callback(eig_into, jax.ShapeDtypeStruct((32, 6), np.float32),
                                      num_batch_dims=1, with_index=True))
buffer_w = in_place(xs)
jax.block_until_ready(buffer_w)

bp.partition_callback(package_eig, num_batch_dims=1)
package_w, package_total = package(xs)
jax.block_until_ready(package_total)
np.savez(f"{out}.{process_id}.npz",
         w=multihost_utils.process_allgather(w, tiled=True),
         who=multihost_utils.process_allgather(who, tiled=True),
         total=np.asarray(total), pure_rows=np.array(sorted(pure_rows)),
         io_rows=np.array(sorted(io_rows)), hlo=np.array(text),
         package_w=multihost_utils.process_allgather(package_w, tiled=True),
         package_total=np.asarray(package_total),
         package_block_rows=np.array([len(b) for b in package_blocks]),
         package_firsts=np.sort(np.concatenate(package_blocks)),
         buffer_w=multihost_utils.process_allgather(buffer_w, tiled=True),
         buffer_rows=np.array(sorted(buffer_rows)))
jax.distributed.shutdown()
