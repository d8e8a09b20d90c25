"""Runs a program with an uneven sharding (13 rows over 8 simulated devices,
then an all-gather) many times without waiting between runs, in fresh
subprocesses, and counts the runs XLA aborts (its collective rendezvous
times out after 40 s and ends the process).

The body is one of ``jnp`` (no foreign call at all), ``jax_callback``
(``jax.pure_callback``) and ``bp_callback`` (``batchpart.pure_callback``),
so the count says whether a hang is batchpart's or XLA's CPU runtime's.

  python scripts/uneven_loop.py --bodies jnp,jax_callback,bp_callback --reps 5
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import textwrap

_PROGRAM = textwrap.dedent("""
    import sys
    import jax
    jax.config.update("jax_num_cpu_devices", 8)
    import numpy as np, jax.numpy as jnp
    import batchpart as bp
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

    body, runs = sys.argv[1], int(sys.argv[2])
    mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))
    out = jax.ShapeDtypeStruct((13, 4), np.float32)

    def twice(x):
      return np.asarray(x) * 2

    @jax.jit
    def program(x):
      x = jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P("x")))
      if body == "jnp":
        y = jnp.sin(x) * 2
      elif body == "jax_callback":
        y = jax.pure_callback(twice, out, x, vmap_method="broadcast_all")
      else:
        y = bp.pure_callback(twice, out, x, signature="(k)->(k)")
      return jax.lax.with_sharding_constraint(y, NamedSharding(mesh, P()))

    x = jnp.arange(13 * 4, dtype=np.float32).reshape(13, 4)
    results = [program(x) for _ in range(runs)]
    for r in results:
      r.block_until_ready()
    print("finished")
""")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--bodies", default="jnp,jax_callback,bp_callback")
  parser.add_argument("--reps", type=int, default=5)
  parser.add_argument("--runs", type=int, default=300)
  args = parser.parse_args()
  for body in args.bodies.split(","):
    aborted = 0
    for _ in range(args.reps):
      try:
        done = subprocess.run([sys.executable, "-c", _PROGRAM, body, str(args.runs)],
                              capture_output=True, text=True, timeout=120)
        aborted += "finished" not in done.stdout
      except subprocess.TimeoutExpired:
        aborted += 1
    print(f"{body}: {aborted} of {args.reps} processes aborted "
          f"({args.runs} runs each, no wait between runs)", flush=True)


if __name__ == "__main__":
  main()
