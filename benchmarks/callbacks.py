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

  python benchmarks/callbacks.py           # prints a markdown table
  python benchmarks/callbacks.py --quick   # (256, 48, 48), fewer repeats
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
  import numpy as np
  from _timing import fmt_time, interleaved
  from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

  import batchpart as bp
  from batchpart import _hlo

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
  candidates = {"bp.pure_callback": ours, "jax.pure_callback": stock,
                "shard_map(jax.pure_callback)": by_hand}

  def received(text: str) -> int:
    return sum(sum(t.nbytes for t in c.result_types) for c in _hlo.collectives(text))

  rows = []
  for partitioner in ("shardy", "gspmd"):
    jax.config.update("jax_use_shardy_partitioner", partitioner == "shardy")
    jitted = {name: jax.jit(f) for name, f in candidates.items()}
    for f in jitted.values():
      np.testing.assert_allclose(f(xs), want, rtol=1e-8, atol=1e-8)
    times = interleaved(jitted, (xs,), repeats=3 if quick else 11)
    for name, f in jitted.items():
      text = f.lower(xs).compile().as_text()
      rows.append((partitioner, name, times[name], received(text)))
  base = {p: t for p, name, t, _ in rows if name == "bp.pure_callback"}
  print(f"eigvalsh on ({n}, {k}, {k}) float64, batch-sharded over 8 simulated CPU devices, "
        f"jax {jax.__version__}\n")
  print("| partitioner | callback | time | vs bp.pure_callback | bytes received "
        "per device |")
  print("| --- | --- | ---: | ---: | ---: |")
  for partitioner, name, t, nbytes in rows:
    print(f"| {partitioner} | {name} | {fmt_time(t).strip()} | "
          f"{t / base[partitioner]:.2f}x | {nbytes:,} |")
  print(f"\noperand: {x.nbytes:,} bytes ({x.nbytes // 8:,} per device)")


if __name__ == "__main__":
  main(sys.argv[1:])
