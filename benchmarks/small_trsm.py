"""The interleaved small-matrix triangular solve (cc/lapack/small_triangular_solve.cc)
against the path it replaces (BLAS trsm per matrix, or substitution on rows),
and against jax.lax.linalg.triangular_solve: one CPU device, single-threaded.

  python benchmarks/small_trsm.py            # the switch-point grid
  python benchmarks/small_trsm.py --targets  # 2048x16x16 f64 and 4096x8x8 f32 vs jax
"""

from __future__ import annotations

import argparse
import os
import sys

import jax

jax.config.update("jax_num_cpu_devices", 1)
jax.config.update("jax_cpu_enable_async_dispatch", False)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
import _timing  # noqa: E402

import batchpart as bp  # noqa: E402
from batchpart import _core  # noqa: E402


def _inputs(batch, n, rhs, dtype, seed=0):
  rng = np.random.default_rng(seed)
  a = np.tril(rng.standard_normal((batch, n, n))) + n * np.eye(n)
  b = rng.standard_normal((batch, n, rhs))
  return jnp.asarray(a, dtype), jnp.asarray(b, dtype)


def _with_mode(f, mode):
  """f run with batchpart's triangular solve forced onto one path."""
  def run(*args):
    _core.lapack.set_small_path("triangular_solve", mode)
    try:
      return jax.block_until_ready(f(*args))
    finally:
      _core.lapack.set_small_path("triangular_solve", "auto")
  return run


def _bp(left_side=True):
  return jax.jit(lambda a, b: bp.linalg.triangular_solve(a, b, left_side=left_side, lower=True))


def _lax():
  return jax.jit(lambda a, b: jax.lax.linalg.triangular_solve(a, b, left_side=True, lower=True))


def switch_grid(batch, sizes, rhs_counts, dtypes, repeats):
  print(f"batch {batch}, left lower, single-threaded; us per call (per batch)", flush=True)
  print("| dtype | n | rhs | today's path | interleaved | speed-up |")
  print("| --- | ---: | ---: | ---: | ---: | ---: |")
  f = _bp()
  for dtype in dtypes:
    for rhs in rhs_counts:
      for n in sizes:
        args = _inputs(batch, n, rhs, dtype)
        t = _timing.interleaved({"never": _with_mode(f, "never"),
                                 "always": _with_mode(f, "always")}, args, repeats=repeats,
                                min_time=0.05, settle=0.02)
        print(f"| {np.dtype(dtype).name} | {n} | {rhs} | {t['never'] * 1e6:.1f} | "
              f"{t['always'] * 1e6:.1f} | {t['never'] / t['always']:.2f}x |", flush=True)


def targets(repeats):
  print("| shape | dtype | jax.lax | batchpart (auto) | batchpart, today's path | vs jax.lax |")
  print("| --- | --- | ---: | ---: | ---: | ---: |")
  for batch, n, dtype in [(2048, 16, np.float64), (4096, 8, np.float32)]:
    a, b = _inputs(batch, n, 1, dtype)
    f = _bp()
    t = _timing.interleaved({"lax": _lax(), "auto": _with_mode(f, "auto"),
                             "never": _with_mode(f, "never")}, (a, b), repeats=repeats,
                            min_time=0.1, settle=0.05)
    print(f"| {batch}x{n}x{n} | {np.dtype(dtype).name} | {t['lax'] * 1e6:.1f}us | "
          f"{t['auto'] * 1e6:.1f}us | {t['never'] * 1e6:.1f}us | "
          f"{t['lax'] / t['auto']:.2f}x |", flush=True)


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--targets", action="store_true")
  parser.add_argument("--batch", type=int, default=1024)
  parser.add_argument("--sizes", default="2,3,4,6,8,12,16,20,24,28,32,40,48,64")
  parser.add_argument("--rhs", default="1,4")
  parser.add_argument("--dtypes", default="float32,float64")
  parser.add_argument("--repeats", type=int, default=5)
  args = parser.parse_args()
  jax.config.update("jax_enable_x64", True)
  # Single-threaded: the switch compares per-matrix cost, not threading.
  _core.lapack.set_intra_op_parallelism(False)
  if args.targets:
    targets(args.repeats)
  else:
    switch_grid(args.batch, [int(s) for s in args.sizes.split(",")],
                [int(r) for r in args.rhs.split(",")],
                [np.dtype(d) for d in args.dtypes.split(",")], args.repeats)


if __name__ == "__main__":
  main()
