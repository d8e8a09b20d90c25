"""Single-threaded timing of the interleaved small-matrix LU and solve
(cc/lapack/small_lu.*) against the per-matrix path they replace, and of both
against jax's own kernels, on one CPU device.

  python benchmarks/small_lu.py sweep   # per-matrix us by n, both paths
  python benchmarks/small_lu.py jax     # the headline sizes against jax

The per-matrix path is what the kernels run with
``_core.lapack.set_small_path("lu", "never")``; batch loops run serially
(``set_intra_op_parallelism(False)``), so the numbers are one core's.
"""

from __future__ import annotations

import argparse

import jax

jax.config.update("jax_num_cpu_devices", 1)
jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _timing import fastest  # noqa: E402

import batchpart as bp  # noqa: E402
from batchpart import _core, _lapack_targets  # noqa: E402
from batchpart._lapack_targets import column_major  # noqa: E402


def best_seconds(f, args, *, small_lu: bool, repeats: int = 5, min_time: float = 0.05) -> float:
  """The fastest of `repeats` rounds, seconds per call (the machine is
  shared: the minimum is the least disturbed)."""
  _core.lapack.set_small_path("lu", "auto" if small_lu else "never")
  try:
    return fastest(f, args, repeats=repeats, min_time=min_time)
  finally:
    _core.lapack.set_small_path("lu", "auto")


def column_major_getrf(a):
  *batch, m, n = a.shape
  i32 = np.int32
  return jax.ffi.ffi_call(
      "batchpart_getrf",
      [jax.ShapeDtypeStruct(a.shape, a.dtype), jax.ShapeDtypeStruct((*batch, min(m, n)), i32),
       jax.ShapeDtypeStruct((*batch, m), i32), jax.ShapeDtypeStruct(tuple(batch), i32)],
      input_layouts=[column_major(a.shape)],
      output_layouts=[column_major(a.shape), None, None, None])(a)


def column_major_gesv(a, b):
  return jax.ffi.ffi_call(
      "batchpart_gesv",
      [jax.ShapeDtypeStruct(b.shape, b.dtype), jax.ShapeDtypeStruct(b.shape[:-2], np.int32)],
      input_layouts=[column_major(a.shape), column_major(b.shape)],
      output_layouts=[column_major(b.shape), None])(a, b)


def operands(batch, n, dtype, nrhs=1, seed=0):
  rng = np.random.default_rng(seed)
  a = rng.standard_normal((batch, n, n)).astype(dtype) + n * np.eye(n, dtype=dtype)
  b = rng.standard_normal((batch, n, nrhs)).astype(dtype)
  return jnp.asarray(a), jnp.asarray(b)


def sweep(sizes, dtypes, total):
  ops = {
    "lu": (jax.jit(lambda a, b: bp.linalg.lu(a)), False),
    "lu_cm": (jax.jit(lambda a, b: column_major_getrf(a)), False),
    "solve": (jax.jit(lambda a, b: bp.linalg.solve(a, b)), True),
    "solve_cm": (jax.jit(column_major_gesv), True),
  }
  print("op        dtype    n  batch  today_us  interleaved_us  speedup")
  for dtype in dtypes:
    for n in sizes:
      batch = max(64, total // (n * n))
      a, b = operands(batch, n, dtype)
      for name, (f, _) in ops.items():
        today = best_seconds(f, (a, b), small_lu=False) / batch * 1e6
        inter = best_seconds(f, (a, b), small_lu=True) / batch * 1e6
        print(f"{name:9s} {np.dtype(dtype).name:7s} {n:2d} {batch:6d} {today:9.3f} "
              f"{inter:15.3f} {today / inter:8.2f}", flush=True)


def against_jax():
  cases = [(2048, 16, np.float64), (4096, 8, np.float32)]
  print("op     shape           dtype    jax_us  today_us  interleaved_us  vs_jax")
  for batch, n, dtype in cases:
    a, b = operands(batch, n, dtype)
    pairs = {
      "lu": (jax.jit(jax.lax.linalg.lu), jax.jit(bp.linalg.lu), (a,)),
      "solve": (jax.jit(jnp.linalg.solve), jax.jit(bp.linalg.solve), (a, b)),
    }
    for name, (ref, ours, args) in pairs.items():
      t_jax = best_seconds(ref, args, small_lu=True) * 1e6
      today = best_seconds(ours, args, small_lu=False) * 1e6
      inter = best_seconds(ours, args, small_lu=True) * 1e6
      print(f"{name:6s} {batch}x{n}x{n:<9d} {np.dtype(dtype).name:7s} {t_jax:8.0f} {today:9.0f} "
            f"{inter:15.0f} {t_jax / inter:7.2f}x", flush=True)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("what", choices=["sweep", "jax"])
  parser.add_argument("--sizes", type=int, nargs="*",
                      default=[2, 3, 4, 6, 8, 12, 16, 20, 24, 28, 32, 40, 48, 56, 64])
  parser.add_argument("--dtypes", nargs="*", default=["float32", "float64"])
  parser.add_argument("--total", type=int, default=1 << 17,
                      help="about this many matrix elements per batch")
  args = parser.parse_args()
  _lapack_targets.register()
  _core.lapack.set_intra_op_parallelism(False)
  if args.what == "sweep":
    sweep(args.sizes, [np.dtype(d) for d in args.dtypes], args.total)
  else:
    against_jax()


if __name__ == "__main__":
  main()
