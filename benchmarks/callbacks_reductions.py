"""A log-likelihood summed over sharded data through a host callback, 8
simulated CPU devices, interleaved in one process, under Shardy and GSPMD:

- ``bp.pure_callback(..., reduce={"n": "sum"})``: each device calls SciPy on
  its own rows, one all-reduce of one scalar combines the sums;
- ``jax.pure_callback``: jax gathers every row onto device 0 and calls once;
- ``jax.shard_map`` around ``jax.pure_callback``, by hand: the same
  per-device calls, their partial sums returned sharded and added by a second
  program. (A ``jax.lax.psum`` in the same program hangs on simulated CPU
  devices: jax's callback ``device_put``s its operands onto device 0 while
  device 0 waits in the all-reduce, docs/callbacks.md; so does a ``jnp.sum``
  of the partial sums in the same program.)

The callback is ``scipy.stats.norm.logpdf(data, mu, sigma).sum()`` over
``(2**21, 4)`` float64 rows. Also reported: bytes any one device receives
through collectives in the compiled program.

  python benchmarks/callbacks_reductions.py           # prints a markdown table
  python benchmarks/callbacks_reductions.py --quick   # 2**18 rows, fewer repeats
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
  import numpy as np
  import scipy.stats
  from _timing import fmt_time, interleaved
  from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

  import batchpart as bp
  from batchpart import _hlo

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
  candidates = {"bp.pure_callback(reduce=)": ours, "jax.pure_callback": stock,
                "shard_map(jax.pure_callback), then a sum": partials}

  def received(text: str) -> int:
    return sum(sum(t.nbytes for t in c.result_types) for c in _hlo.collectives(text))

  rows = []
  for partitioner in ("shardy", "gspmd"):
    jax.config.update("jax_use_shardy_partitioner", partitioner == "shardy")
    jitted = {name: jax.jit(f) for name, f in candidates.items()}
    by_hand = jitted["shard_map(jax.pure_callback), then a sum"]
    jitted["shard_map(jax.pure_callback), then a sum"] = lambda d, f=by_hand: add(f(d))
    for f in jitted.values():
      np.testing.assert_allclose(float(f(ds)), want, rtol=1e-9)
    times = interleaved(jitted, (ds,), repeats=3 if quick else 11)
    for name, f in jitted.items():
      lowerable = by_hand if name.startswith("shard_map") else f
      text = lowerable.lower(ds).compile().as_text()
      rows.append((partitioner, name, times[name], received(text)))
  base = {p: t for p, name, t, _ in rows if name == "bp.pure_callback(reduce=)"}
  print(f"norm.logpdf summed over ({n}, 4) float64 rows, sharded over 8 simulated CPU "
        f"devices, jax {jax.__version__}\n")
  print("| partitioner | callback | time | vs bp.pure_callback(reduce=) | bytes received "
        "per device |")
  print("| --- | --- | ---: | ---: | ---: |")
  for partitioner, name, t, nbytes in rows:
    print(f"| {partitioner} | {name} | {fmt_time(t).strip()} | "
          f"{t / base[partitioner]:.2f}x | {nbytes} |")


if __name__ == "__main__":
  main(sys.argv[1:])
