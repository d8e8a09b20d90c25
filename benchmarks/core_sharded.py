"""Matrix-dim-sharded input on 8 simulated CPU devices: batchpart.linalg vs a
hand-written reshard + shard_map of the same kernels vs jnp.linalg, under
Shardy and GSPMD, interleaved in one process per partitioner.

  python benchmarks/core_sharded.py          # writes docs/benchmarks-core-sharded.md
  python benchmarks/core_sharded.py --quick

Candidates, each jitted with ``out_shardings`` = the batch sharding (what a
user who goes on with per-matrix work wants) unless noted:

- batchpart: ``bp.linalg.<op>`` on the ``P(None, "x")`` input;
- batchpart, default out: the same with no ``out_shardings`` (under Shardy
  the result keeps the input's layout: one more all-to-all);
- shard_map: ``with_sharding_constraint`` onto ``P("x")``, then
  ``jax.shard_map`` of ``bp.linalg.<op>`` (the same kernels, by hand);
- jnp.linalg: gathers the matrices; every device computes the whole batch
  of the steps jaxlib cannot split (see the "jnp work" column);
- jnp.linalg on batch-sharded input: jaxlib's own kernels, each device on its
  shard. jnp's core-sharded time over this one is how much more work jnp
  does on the core-sharded input: the ratio an equally fast kernel with a
  free reshard would reach, and so the ceiling of "vs jnp.linalg".

Each partitioner runs in a child process with a time limit (jaxlib's LAPACK
kernels can deadlock XLA's CPU pool on simulated devices,
docs/reliability.md); a child that hangs is retried.
"""

from __future__ import annotations

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DOCS = os.path.join(os.path.dirname(HERE), "docs")


def _ops():
  import jax
  import jax.numpy as jnp

  import batchpart as bp
  L = jax.lax.linalg
  return {
      "cholesky": (bp.linalg.cholesky, jnp.linalg.cholesky),
      "lu": (lambda a: bp.linalg.lu(a)[0], lambda a: L.lu(a)[0]),
      "qr": (lambda a: bp.linalg.qr(a), lambda a: jnp.linalg.qr(a)),
      "eigh": (lambda a: bp.linalg.eigh(a), lambda a: jnp.linalg.eigh(a)),
      "svd": (lambda a: bp.linalg.svd(a, full_matrices=False),
              lambda a: jnp.linalg.svd(a, full_matrices=False)),
      "triangular_solve": (lambda a: bp.linalg.triangular_solve(a, a),
                           lambda a: L.triangular_solve(a, a, left_side=True, lower=True)),
      "solve": (lambda a: bp.linalg.solve(a, a), lambda a: jnp.linalg.solve(a, a)),
  }


def child(partitioner: str, quick: bool) -> list[dict]:
  os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
  sys.path.insert(0, HERE)
  import jax
  import numpy as np
  from _timing import interleaved
  from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

  jax.config.update("jax_use_shardy_partitioner", partitioner == "shardy")
  jax.config.update("jax_cpu_enable_async_dispatch", False)
  mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))
  batch, n = (256, 32) if quick else (512, 64)
  m = np.random.default_rng(0).standard_normal((batch, n, n)).astype(np.float32)
  spd = m @ np.swapaxes(m, -1, -2) / n + np.eye(n, dtype=np.float32)
  a = jax.device_put(spd, NamedSharding(mesh, P(None, "x")))
  out = NamedSharding(mesh, P("x"))
  a_batch = jax.device_put(spd, out)
  rows = []
  for name, (ours, theirs) in _ops().items():
    by_hand = jax.shard_map(ours, mesh=mesh, in_specs=P("x"), out_specs=P("x"))
    candidates = {
        "batchpart": jax.jit(ours, out_shardings=out),
        "batchpart_default_out": jax.jit(ours),
        "shard_map": jax.jit(
            lambda a, f=by_hand: f(jax.lax.with_sharding_constraint(a, out)),
            out_shardings=out),
        "jnp": jax.jit(theirs, out_shardings=out),
    }
    # The same jitted jnp candidate, called on the batch-sharded copy.
    candidates["jnp_batch_input"] = lambda _, f=candidates["jnp"]: f(a_batch)
    want = jax.tree.map(np.asarray, candidates["shard_map"](a))
    for k in ("batchpart", "batchpart_default_out"):
      for g, w in zip(jax.tree.leaves(candidates[k](a)), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(g), w, rtol=1e-4, atol=1e-4)
    t = interleaved(candidates, (a,), repeats=3 if quick else 8)
    rows.append({"op": name, "partitioner": partitioner, **t})
    print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
  return rows


def write(rows, quick: bool) -> str:
  ms = lambda s: f"{s * 1e3:.2f} ms"
  lines = [
      "# Matrix-dim-sharded input: batchpart vs shard_map by hand vs jnp.linalg",
      "",
      "8 simulated CPU devices on a 2-core machine, batch "
      f"{'256 of 32x32' if quick else '512 of 64x64'} float32 sharded `P(None, \"x\")`;",
      "candidates interleaved in one process per partitioner",
      "(`benchmarks/core_sharded.py`). Ratios > 1: batchpart is faster.",
      "",
      "| op | partitioner | batchpart | batchpart, default out | shard_map by hand | jnp.linalg "
      "| jnp.linalg, batch-sharded input | vs shard_map | vs jnp.linalg | jnp work |",
      "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
  ]
  for r in rows:
    lines.append(
        f"| {r['op']} | {r['partitioner']} | {ms(r['batchpart'])} | "
        f"{ms(r['batchpart_default_out'])} | {ms(r['shard_map'])} | {ms(r['jnp'])} | "
        f"{ms(r['jnp_batch_input'])} | "
        f"{r['shard_map'] / r['batchpart']:.2f}x | {r['jnp'] / r['batchpart']:.2f}x | "
        f"{r['jnp'] / r['jnp_batch_input']:.2f}x |")
  lines += [
      "",
      "\"default out\" leaves the result sharding to XLA: under GSPMD batchpart reports the",
      "batch sharding (no second all-to-all), under Shardy the result keeps the input's layout",
      "(docs/partitioning.md, core-sharded inputs), which costs one more all-to-all.",
      "\"jnp work\" is jnp.linalg's core-sharded time over its batch-sharded time: the ceiling",
      "of \"vs jnp.linalg\" for a kernel as fast as jaxlib's with a free reshard (jnp replicates",
      "only the first kernel of a chain, e.g. geqrf of qr and getrf of solve).",
      "Each candidate runs after a pause that lets OpenBLAS threads left spinning by the",
      "previous one go to sleep (`benchmarks/_timing.py`, SETTLE_SECONDS).",
      "",
  ]
  from _timing import write_doc
  return write_doc(os.path.join(DOCS, "benchmarks-core-sharded.md"), lines)


def main() -> None:
  sys.path.insert(0, HERE)
  from _timing import parts_in_children
  done = parts_in_children(__file__, {"shardy": lambda quick: child("shardy", quick),
                                      "gspmd": lambda quick: child("gspmd", quick)},
                           timeout=900)
  if done is not None:
    print(write(*done))


if __name__ == "__main__":
  main()
