"""jnp.linalg through bp.partition_primitive on jax.lax.linalg's primitives,
on 8 simulated devices (run by test_adopt.py: the wrapping is process-wide).

``python adopt_linalg_worker.py shardy|gspmd``; prints ALL OK.
"""

import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P  # noqa: E402

import batchpart as bp  # noqa: E402
from batchpart import _hlo  # noqa: E402

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_use_shardy_partitioner", sys.argv[1] == "shardy")
jax.config.update("jax_cpu_enable_async_dispatch", False)
mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))
r = np.random.default_rng(0)
m = r.standard_normal((16, 8, 8))
a = m @ np.swapaxes(m, -1, -2) + 8 * np.eye(8)
L = jax.lax.linalg
OPS = {
    "cholesky": jnp.linalg.cholesky,
    "eigh": lambda a: jnp.linalg.eigh(a),
    "qr": lambda a: jnp.linalg.qr(a),
    "svd": lambda a: jnp.linalg.svd(a),
    "lu": lambda a: L.lu(a),
    "triangular_solve": lambda a: L.triangular_solve(a, a, left_side=True, lower=True),
}


def compiled(f, x):
  return jax.jit(f).lower(x).compile().as_text()


def lapack_calls(text):
  return [c for c in _hlo.custom_calls(text) if c.target.startswith("lapack_")]


stock = {k: jax.tree.map(np.asarray, f(a)) for k, f in OPS.items()}
stock_batch = {k: compiled(f, jax.device_put(a, NamedSharding(mesh, P("x"))))
               for k, f in OPS.items()}
nbd = lambda operand_shapes, result_shapes: len(operand_shapes[0]) - 2
for p in (L.cholesky_p, L.eigh_p, L.qr_p, L.svd_p, L.lu_p, L.triangular_solve_p):
  bp.partition_primitive(p, num_batch_dims=nbd)

for k, f in OPS.items():
  for spec in (P("x"), P(None, "x"), P(None, None, "x")):
    x = jax.device_put(a, NamedSharding(mesh, spec))
    text = compiled(f, x)
    calls = lapack_calls(text)
    assert calls, (k, spec)
    for c in calls:   # no device factors the full batch
      assert all(t.shape[0] == 2 for t in c.operand_types), (k, spec, c.text[:200])
    if spec == P("x"):
      assert not _hlo.collectives(text), (k, [c.opcode for c in _hlo.collectives(text)])
    got = jax.tree.map(np.asarray, jax.jit(f)(x))
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(stock[k])):
      np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-9, err_msg=f"{k} {spec}")
  print(k, "ok", flush=True)
# Unsharded use is jax's own behaviour: the same values.
for k, f in OPS.items():
  for g, w in zip(jax.tree.leaves(f(a)), jax.tree.leaves(stock[k])):
    np.testing.assert_allclose(np.asarray(g), w, rtol=1e-12, atol=1e-12)
print("ALL OK")
