"""Host callbacks on a batch-sharded input, 8 simulated CPU devices,
interleaved in one process, under Shardy and GSPMD:

- ``bp.pure_callback``: each device calls NumPy on its own block;
- ``jax.pure_callback``: jax gathers the batch onto device 0, calls once on
  all of it, and scatters the result back;
- ``jax.shard_map`` around ``jax.pure_callback``: per block, by hand.

The callback is ``np.linalg.eigvalsh`` on ``(1024, 48, 48)`` float64. Also
reported: the bytes any one device receives through collectives in the
compiled program (the largest collective result on one device, summed over
the program's collectives).

Then a log-likelihood summed over sharded data (``reduce=``):
``scipy.stats.norm.logpdf(data, mu, sigma).sum()`` over ``(2**21, 4)`` float64
rows, through ``bp.pure_callback(..., signature="(n,k)->()",
reduce={"n": "sum"})`` (each device calls SciPy on its own rows, one
all-reduce of one scalar combines the sums), ``jax.pure_callback`` (every row
gathered onto device 0, one call) and ``jax.shard_map`` around
``jax.pure_callback`` by hand, its per-device sums added by a second program
(a ``jax.lax.psum`` or ``jnp.sum`` in the same program hangs on simulated CPU
devices: jax's callback ``device_put``s its operands onto device 0 while
device 0 waits in the collective, docs/callbacks.md).

  python benchmarks/callbacks.py           # prints two markdown tables
  python benchmarks/callbacks.py --quick   # (256, 48, 48) and 2**18 rows, fewer repeats
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main(argv):
  quick = "--quick" in argv
  os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
  sys.path.insert(0, HERE)
  import jax
  jax.config.update("jax_enable_x64", True)
  jax.config.update("jax_cpu_enable_async_dispatch", False)
  eigvalsh(quick)
  print()
  log_likelihood(quick)


def eigvalsh(quick: bool) -> None:
  """The eigvalsh table."""
  import jax
  import numpy as np
  from _timing import print_comparison, under_both_partitioners
  from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

  import batchpart as bp

  n, k = (256, 48) if quick else (1024, 48)
  mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))
  a = np.random.default_rng(0).standard_normal((n, k, k))
  x = a + np.swapaxes(a, -1, -2)
  xs = jax.device_put(x, NamedSharding(mesh, P("x")))
  want = np.linalg.eigvalsh(x)
  out = jax.ShapeDtypeStruct((n, k), np.float64)
  local = jax.ShapeDtypeStruct((n // 8, k), np.float64)

  def ours(x):
    return bp.pure_callback(np.linalg.eigvalsh, out, x, num_batch_dims=1)

  def stock(x):
    return jax.pure_callback(np.linalg.eigvalsh, out, x)

  by_hand = jax.shard_map(
      lambda x: jax.pure_callback(np.linalg.eigvalsh, local, x),
      mesh=mesh, in_specs=P("x"), out_specs=P("x"))
  named = {"bp.pure_callback": ours, "jax.pure_callback": stock,
           "shard_map(jax.pure_callback)": by_hand}

  def candidates():
    return {name: (jax.jit(f),) * 2 for name, f in named.items()}

  check = lambda y: np.testing.assert_allclose(y, want, rtol=1e-8, atol=1e-8)
  rows = under_both_partitioners(candidates, (xs,), check, repeats=3 if quick else 11)
  print(f"eigvalsh on ({n}, {k}, {k}) float64, batch-sharded over 8 simulated CPU devices, "
        f"jax {jax.__version__}\n")
  print_comparison(rows, "bp.pure_callback", "callback")
  print(f"\noperand: {x.nbytes:,} bytes ({x.nbytes // 8:,} per device)")


def log_likelihood(quick: bool) -> None:
  """The log-likelihood table: a sum over sharded rows (reduce=)."""
  import jax
  import numpy as np
  import scipy.stats
  from _timing import print_comparison, under_both_partitioners
  from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

  import batchpart as bp

  n = 2 ** 18 if quick else 2 ** 21
  mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))
  data = np.random.default_rng(0).normal(0.3, 1.7, size=(n, 4))
  ds = jax.device_put(data, NamedSharding(mesh, P("x")))
  want = scipy.stats.norm.logpdf(data, 0.25, 1.5).sum()
  scalar = jax.ShapeDtypeStruct((), np.float64)

  def loglik(d):
    return np.asarray(scipy.stats.norm.logpdf(d, 0.25, 1.5).sum(), np.float64)

  def ours(d):
    return bp.pure_callback(loglik, scalar, d, signature="(n,k)->()", reduce={"n": "sum"})

  def stock(d):
    return jax.pure_callback(loglik, scalar, d)

  partials = jax.shard_map(
      lambda d: jax.pure_callback(loglik, scalar, d)[None],
      mesh=mesh, in_specs=P("x"), out_specs=P("x"))
  add = jax.jit(lambda p: p.sum())

  def candidates():
    ours_jit, stock_jit, partials_jit = jax.jit(ours), jax.jit(stock), jax.jit(partials)
    return {"bp.pure_callback(reduce=)": (ours_jit, ours_jit),
            "jax.pure_callback": (stock_jit, stock_jit),
            "shard_map(jax.pure_callback), then a sum": (lambda d: add(partials_jit(d)),
                                                         partials_jit)}

  check = lambda y: np.testing.assert_allclose(float(y), want, rtol=1e-9)
  rows = under_both_partitioners(candidates, (ds,), check, repeats=3 if quick else 11)
  print(f"norm.logpdf summed over ({n}, 4) float64 rows, sharded over 8 simulated CPU "
        f"devices, jax {jax.__version__}\n")
  print_comparison(rows, "bp.pure_callback(reduce=)", "callback")


if __name__ == "__main__":
  main(sys.argv[1:])
