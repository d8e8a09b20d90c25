"""A smoke test of an installed batchpart, and typed example code.

Runs from any directory against whatever ``import batchpart`` finds (CI runs
it from outside the checkout against an installed wheel; cibuildwheel's
test-command does the same), on 4 simulated CPU devices:

- the compiled LAPACK kernels through ``bp.linalg`` on a batch-sharded input,
- a host callback through ``bp.pure_callback``,
- an FFI call through ``bp.ffi_call`` (one of ``batchpart.testing``'s kernels),

each checked against NumPy, and ``bp.explain`` showing that no device gathers
the batch. ``mypy`` checks this file with the package (pyproject.toml), so it
is also the example that proves the public annotations usable.

    python examples/smoke.py
"""

from __future__ import annotations

import sys

import jax

jax.config.update("jax_num_cpu_devices", 4)

import jax.numpy as jnp  # noqa: E402  (after the device count is set)
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import batchpart as bp  # noqa: E402
from batchpart import testing  # noqa: E402


def row_norms(x: np.ndarray) -> np.ndarray:
  """The host function: runs on each device's rows only."""
  return np.linalg.norm(x, axis=-1).astype(x.dtype)


def norms_on_host(x: jax.Array) -> jax.Array:
  result = jax.ShapeDtypeStruct(x.shape[:-1], x.dtype)
  return bp.pure_callback(row_norms, result, x, num_batch_dims=1)


def softmax(x: jax.Array) -> tuple[jax.Array, jax.Array]:
  y, lse = bp.ffi_call(
      "batchpart_test_softmax",
      (jax.ShapeDtypeStruct(x.shape, x.dtype), jax.ShapeDtypeStruct(x.shape[:-1], x.dtype)),
      signature="(n)->(n),()")(x)
  return y, lse


def main() -> int:
  print(f"batchpart {bp.__version__} from {bp.__file__}")
  print(f"jax {jax.__version__}, {jax.device_count()} devices")
  mesh = jax.make_mesh((jax.device_count(),), ("b",))
  rows = NamedSharding(mesh, P("b"))
  rng = np.random.default_rng(0)

  m = rng.standard_normal((16, 8, 8)).astype(np.float32)
  spd = m @ m.transpose(0, 2, 1) + 8 * np.eye(8, dtype=np.float32)
  a = jax.device_put(spd, rows)
  factor = jax.jit(bp.linalg.cholesky)(a)
  np.testing.assert_allclose(np.asarray(factor), np.linalg.cholesky(spd), rtol=1e-4, atol=1e-4)
  report = bp.explain(bp.linalg.cholesky, a)
  print(report)
  for call in report.calls:
    assert call.replication == 1 and not call.collectives_before, call

  x = jax.device_put(rng.standard_normal((16, 32)).astype(np.float32), rows)
  norms = jax.jit(norms_on_host)(x)
  np.testing.assert_allclose(np.asarray(norms), np.linalg.norm(np.asarray(x), axis=-1),
                             rtol=1e-5)

  testing.register()
  y, lse = jax.jit(softmax)(x)
  expected = jax.nn.softmax(jnp.asarray(x), axis=-1)
  np.testing.assert_allclose(np.asarray(y), np.asarray(expected), rtol=1e-5, atol=1e-6)
  assert lse.shape == (16,)

  print("smoke: ok")
  return 0


if __name__ == "__main__":
  sys.exit(main())
