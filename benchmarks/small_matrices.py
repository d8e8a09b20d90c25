"""Many small matrices on one CPU device: batchpart.linalg against jax and
against the memory limit, measured interleaved in one process.

The memory limit is a jitted elementwise pass over the same operands (each
read once, a result of the same size written once): no kernel that reads its
input and writes its output can beat it, and a kernel within a small factor
of it spends its time moving data rather than in per-matrix overhead.

  python benchmarks/small_matrices.py             # the two headline shapes, the n = 2..64
                                                  # curve, docs/benchmarks-small-matrices.png
  python benchmarks/small_matrices.py --headline  # only 2048x16x16 f64 and 4096x8x8 f32
  python benchmarks/small_matrices.py --switch    # n = 2..512: the small-matrix kernels
                                                  # against batchpart's per-matrix path
                                                  # (the switch points' check)
"""

from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
# The curve's batch at each n keeps the operands near 2048 x 16 x 16 f64
# (4 MiB): big enough to leave the caches' luck out, small enough to be quick.
CURVE_BYTES = 2048 * 16 * 16 * 8
CURVE_SIZES = (2, 3, 4, 6, 8, 12, 16, 20, 24, 32, 40, 48, 64)
# Untimed calls after each candidate's pause (_timing.interleaved): the
# batch loops' second thread is slow to join after an idle pause.
WARMUP = 0.05


def _ops(jax, jnp, bp):
  """name -> (batchpart fn, jax fn, operand kinds): the ops of the headline table."""
  lax = jax.lax.linalg
  rhs = lambda a: a[..., :, :1]
  return {
      "cholesky": (bp.linalg.cholesky, jnp.linalg.cholesky, "spd"),
      "triangular_solve": (
          lambda a: bp.linalg.triangular_solve(a, rhs(a), left_side=True, lower=True),
          lambda a: lax.triangular_solve(a, rhs(a), left_side=True, lower=True), "spd"),
      "solve": (lambda a: bp.linalg.solve(a, rhs(a)), lambda a: jnp.linalg.solve(a, rhs(a)),
                "spd"),
      "lu": (lambda a: bp.linalg.lu(a)[0], lambda a: lax.lu(a)[0], "general"),
      "qr": (lambda a: bp.linalg.qr(a), lambda a: jnp.linalg.qr(a), "general"),
      "eigh": (lambda a: bp.linalg.eigh(a), lambda a: jnp.linalg.eigh(a), "spd"),
  }


def _matrices(np, batch, n, kind, dtype):
  rng = np.random.default_rng(0)
  x = rng.standard_normal((batch, n, n))
  if np.dtype(dtype).kind == "c":
    x = x + 1j * rng.standard_normal((batch, n, n))
  x = x.astype(dtype)
  if kind == "spd":
    x = x @ np.conj(np.swapaxes(x, -1, -2)) / n + np.eye(n, dtype=dtype)
  return x


def measure(jax, jnp, bp, np, batch, n, dtype, *, repeats):
  """{op: (batchpart s, jax s, memory pass s)} for one shape."""
  from _timing import interleaved
  memory_pass = jax.jit(lambda a: a * 2)   # reads a, writes a result of a's size
  out = {}
  for name, (ours, theirs, kind) in _ops(jax, jnp, bp).items():
    a = jax.device_put(_matrices(np, batch, n, kind, dtype))
    t = interleaved({"bp": jax.jit(ours), "jax": jax.jit(theirs), "pass": memory_pass}, (a,),
                    repeats=repeats, min_time=0.05, warmup=WARMUP)
    out[name] = (t["bp"], t["jax"], t["pass"])
  return out


def _per_matrix_path(core, enabled: bool) -> None:
  """Lets the kernels take their small-matrix paths (the default) or sends
  every batch to the per-matrix LAPACK/BLAS path."""
  for kernel in ("cholesky", "lu", "triangular_solve", "qr", "eigh"):
    core.lapack.set_small_path(kernel, "auto" if enabled else "never")


def switch(jax, jnp, bp, np, sizes, repeats, dtypes, names):
  """Prints, per op and n, the per-matrix path's time over the small-matrix
  kernels' (> 1: the small kernels are faster; where n is above an op's
  switch point both are the same code), both timed in one process."""
  from _timing import interleaved

  from batchpart import _core

  def with_paths(f, enabled):
    def call(a):
      _per_matrix_path(_core, enabled)
      try:
        return jax.block_until_ready(f(a))
      finally:
        _per_matrix_path(_core, True)
    return call

  ops = {name: op for name, op in _ops(jax, jnp, bp).items() if name in names}
  for dtype in dtypes:
    print(f"\n## {dtype}: per-matrix path time / small-matrix kernels time\n")
    print("| n | batch | " + " | ".join(ops) + " |")
    print("| ---: | ---: |" + " ---: |" * len(ops))
    for n in sizes:
      batch = max(2, CURVE_BYTES // (n * n * np.dtype(dtype).itemsize))
      cells = []
      for ours, _, kind in ops.values():
        a = jax.device_put(_matrices(np, batch, n, kind, dtype))
        f = jax.jit(ours)
        t = interleaved({"small": with_paths(f, True), "per_matrix": with_paths(f, False)},
                        (a,), repeats=repeats, min_time=0.05, warmup=WARMUP)
        cells.append(f"{t['per_matrix'] / t['small']:.2f}x")
      print(f"| {n} | {batch} | " + " | ".join(cells) + " |", flush=True)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser()
  parser.add_argument("--headline", action="store_true")
  parser.add_argument("--sizes", default=None, help="comma-separated n for the curve")
  parser.add_argument("--json", default=None, help="write {dtype: {op: {n: ratio}}} here")
  parser.add_argument("--switch", action="store_true")
  parser.add_argument("--dtypes", default="float64,float32",
                      help="--switch: comma-separated dtypes (complex64, complex128 too)")
  parser.add_argument("--ops", default=None, help="--switch: comma-separated ops (default all)")
  parser.add_argument("--repeats", type=int, default=7)
  parser.add_argument("--plot", default=os.path.join(HERE, "..", "docs",
                                                     "benchmarks-small-matrices.png"))
  args = parser.parse_args(argv)
  sys.path.insert(0, HERE)
  from _timing import steady_allocator
  steady = steady_allocator()
  import jax
  jax.config.update("jax_num_cpu_devices", 1)
  jax.config.update("jax_enable_x64", True)
  # Each call timed to its end: with async dispatch a loop of calls queues
  # programs that then compete for the intra-op pool the kernels split over.
  jax.config.update("jax_cpu_enable_async_dispatch", False)
  import jax.numpy as jnp
  import numpy as np
  from _timing import fmt_time

  import batchpart as bp

  if args.switch:
    sizes = (tuple(int(s) for s in args.sizes.split(",")) if args.sizes
             else (2, 4, 8, 12, 16, 24, 28, 32, 48, 64, 128, 256, 512))
    names = args.ops.split(",") if args.ops else list(_ops(jax, jnp, bp))
    switch(jax, jnp, bp, np, sizes, max(3, args.repeats // 2), args.dtypes.split(","), names)
    return 0
  print(f"jax {jax.__version__}, one CPU device, {os.cpu_count()} cores; median of "
        f"interleaved rounds; glibc's malloc thresholds {'fixed' if steady else 'as found'}. "
        "vs jax > 1: batchpart faster; vs pass: batchpart's time over "
        "the memory pass's (1 = at the memory limit).\n")
  # A discarded first round: the process's first timings (allocator, page
  # faults, clocks) run slow, whichever candidate they land on.
  measure(jax, jnp, bp, np, 2048, 16, "float64", repeats=2)
  print("| op | shape | batchpart | jax | memory pass | vs jax | vs pass |")
  print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
  for batch, n, dtype in ((2048, 16, "float64"), (4096, 8, "float32")):
    for name, (ours, theirs, memory) in measure(jax, jnp, bp, np, batch, n, dtype,
                                                 repeats=args.repeats).items():
      print(f"| {name} | {batch}x{n}x{n} {dtype} | {fmt_time(ours)} | {fmt_time(theirs)} | "
            f"{fmt_time(memory)} | {theirs / ours:.2f}x | {ours / memory:.2f}x |", flush=True)
  if args.headline:
    return 0

  sizes = tuple(int(s) for s in args.sizes.split(",")) if args.sizes else CURVE_SIZES
  curve: dict = {}
  for dtype in ("float64", "float32"):
    print(f"\n## {dtype}, n = {sizes[0]}..{sizes[-1]} (batch keeps the operands near 4 MiB)\n")
    print("| n | batch | " + " | ".join(f"{op} vs jax / vs pass" for op in _ops(jax, jnp, bp))
          + " |")
    print("| ---: | ---: |" + " ---: |" * len(_ops(jax, jnp, bp)))
    for n in sizes:
      batch = max(1, CURVE_BYTES // (n * n * np.dtype(dtype).itemsize))
      row = measure(jax, jnp, bp, np, batch, n, dtype, repeats=max(3, args.repeats // 2))
      for op, (ours, theirs, memory) in row.items():
        curve.setdefault(dtype, {}).setdefault(op, {})[n] = {
            "batchpart": ours, "jax": theirs, "pass": memory}
      print(f"| {n} | {batch} | " + " | ".join(
          f"{t / o:.2f}x / {o / m:.1f}x" for o, t, m in row.values()) + " |", flush=True)
  if args.json:
    with open(args.json, "w") as f:
      json.dump(curve, f, indent=1)
  if not args.sizes:
    plot(curve, args.plot)
  return 0


def plot(curve, path):
  """Two panels per dtype: time per matrix of batchpart, jax and the memory pass."""
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError:
    print("matplotlib is not installed: no plot")
    return
  ops = list(next(iter(curve.values())))
  fig, axes = plt.subplots(len(curve), len(ops), figsize=(4 * len(ops), 3.4 * len(curve)),
                           squeeze=False)
  for row, (dtype, by_op) in enumerate(curve.items()):
    for col, op in enumerate(ops):
      ax = axes[row][col]
      ns = sorted(by_op[op])
      itemsize = 8 if dtype == "float64" else 4
      per = {k: [by_op[op][n][k] / max(1, CURVE_BYTES // (n * n * itemsize)) * 1e9 for n in ns]
             for k in ("batchpart", "jax", "pass")}
      for k, style in (("batchpart", "o-"), ("jax", "s--"), ("pass", ":")):
        ax.plot(ns, per[k], style, label=k if k != "pass" else "memory pass")
      ax.set_xscale("log", base=2)
      ax.set_yscale("log")
      ax.set_title(f"{op}, {dtype}")
      ax.set_xlabel("n")
      ax.set_ylabel("ns per matrix")
      ax.grid(True, which="both", alpha=0.3)
  axes[0][0].legend()
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  print(f"\nwrote {path}")


if __name__ == "__main__":
  sys.exit(main())
