"""The interleaved small-matrix Cholesky (cc/lapack/small_cholesky.cc) against
the LAPACK path of the same targets, and bp.linalg.cholesky against
jnp.linalg.cholesky, on one CPU device.

  python benchmarks/small_cholesky.py switch   # us per matrix, n = 2..64, one thread
  python benchmarks/small_cholesky.py switch --posv
  python benchmarks/small_cholesky.py batch    # a small batch, to place kMinBatch
  python benchmarks/small_cholesky.py jnp      # 2048x16x16 f64, 4096x8x8 f32

The switch table is what small_cholesky.cc's kMaxSize comment quotes: the
potrf (or posv) target called directly, with the batch loop serial, once
with the interleaved path on and once forced onto LAPACK.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))


def _setup():
  import jax
  jax.config.update("jax_num_cpu_devices", 1)
  jax.config.update("jax_cpu_enable_async_dispatch", False)
  jax.config.update("jax_enable_x64", True)
  return jax


def _spd(batch, n, dtype):
  import numpy as np

  from batchpart.testing import hermitian_pd
  return hermitian_pd(np.random.default_rng(0), (batch,), n, dtype)


# The targets are called in jax's default (row-major) layout: a symmetric
# matrix is its own transpose, and a column-major layout would add two
# relayout copies to both paths' times.
def _potrf(jax, a):
  import numpy as np
  call = jax.ffi.ffi_call(
      "batchpart_potrf",
      [jax.ShapeDtypeStruct(a.shape, a.dtype), jax.ShapeDtypeStruct(a.shape[:-2], np.int32)])
  return jax.jit(lambda x: call(x, lower=True, symmetrize=False))


def _posv(jax, a, b):
  import numpy as np
  # b is (batch, n, 1): one right-hand side, the same memory in either layout.
  call = jax.ffi.ffi_call(
      "batchpart_posv",
      [jax.ShapeDtypeStruct(b.shape, b.dtype), jax.ShapeDtypeStruct(b.shape[:-2], np.int32)])
  return jax.jit(lambda x, y: call(x, y, lower=True))


def _both_paths(jax, fn, args, repeats):
  """Seconds per call of `fn` with the interleaved path on and off. The
  global switch is read at run time, so one compiled function serves both."""
  import time

  from batchpart import _core
  out = {}
  for enabled in (False, True):
    _core.lapack.set_small_path("cholesky", "always" if enabled else "never")
    jax.block_until_ready(fn(*args))
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    loops = max(1, int(0.05 / max(time.perf_counter() - t0, 1e-7)))
    samples = []
    for _ in range(repeats):
      t0 = time.perf_counter()
      for _ in range(loops):
        r = fn(*args)
      jax.block_until_ready(r)
      samples.append((time.perf_counter() - t0) / loops)
    out[enabled] = min(samples)  # the machine is shared: the least disturbed run
  _core.lapack.set_small_path("cholesky", "auto")
  return out[False], out[True]


def switch(posv: bool, batch: int, sizes, repeats: int):
  import numpy as np
  jax = _setup()
  from batchpart import _core, _lapack_targets
  _lapack_targets.register()
  _core.lapack.set_intra_op_parallelism(False)
  what = "posv (nrhs 1)" if posv else "potrf"
  print(f"{what}, batch {batch}, one thread: us per matrix")
  print("| n | f64 LAPACK | f64 interleaved | f32 LAPACK | f32 interleaved |")
  print("|--:|--:|--:|--:|--:|")
  for n in sizes:
    row = [str(n)]
    for dtype in (np.float64, np.float32):
      a = _spd(batch, n, dtype)
      if posv:
        b = np.ones((batch, n, 1), dtype)
        args, fn = (a, b), _posv(jax, a, b)
      else:
        args, fn = (a,), _potrf(jax, a)
      lapack, small = _both_paths(jax, fn, args, repeats)
      row += [f"{lapack / batch * 1e6:.3f}", f"{small / batch * 1e6:.3f}"]
    print("| " + " | ".join(row) + " |", flush=True)


def small_batches(n_values, repeats: int):
  import numpy as np
  jax = _setup()
  from batchpart import _core, _lapack_targets
  _lapack_targets.register()
  _core.lapack.set_intra_op_parallelism(False)
  print("potrf, one thread: us per call (LAPACK / interleaved)")
  for dtype in (np.float64, np.float32):
    for n in n_values:
      cells = []
      for batch in (1, 2, 3, 4, 6, 8):
        a = _spd(batch, n, dtype)
        lapack, small = _both_paths(jax, _potrf(jax, a), (a,), repeats)
        cells.append(f"b={batch}: {lapack * 1e6:.2f}/{small * 1e6:.2f}")
      print(np.dtype(dtype).name, f"n={n}", "  ".join(cells), flush=True)


def against_jnp(repeats: int):
  import numpy as np
  jax = _setup()
  import jax.numpy as jnp
  from _timing import interleaved

  import batchpart as bp
  for batch, n, dtype in ((2048, 16, np.float64), (4096, 8, np.float32)):
    a = jnp.asarray(_spd(batch, n, dtype))
    times = interleaved({"jnp.linalg.cholesky": jax.jit(jnp.linalg.cholesky),
                         "bp.linalg.cholesky": jax.jit(bp.linalg.cholesky)}, (a,),
                        repeats=repeats)
    np.testing.assert_allclose(np.asarray(jax.jit(bp.linalg.cholesky)(a)),
                               np.asarray(jnp.linalg.cholesky(a)), rtol=1e-4, atol=1e-4)
    j, b = times["jnp.linalg.cholesky"], times["bp.linalg.cholesky"]
    print(f"{batch}x{n}x{n} {np.dtype(dtype).name}: jnp {j * 1e6:.0f} us, "
          f"bp {b * 1e6:.0f} us, {j / b:.2f}x", flush=True)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("what", choices=["switch", "batch", "jnp"])
  parser.add_argument("--posv", action="store_true")
  parser.add_argument("--batch", type=int, default=1024)
  parser.add_argument("--sizes", default="2,3,4,6,8,12,16,20,24,28,32,40,48,56,64")
  parser.add_argument("--repeats", type=int, default=5)
  args = parser.parse_args()
  if args.what == "switch":
    switch(args.posv, args.batch, [int(s) for s in args.sizes.split(",")], args.repeats)
  elif args.what == "batch":
    small_batches([2, 8, 16, 32], args.repeats)
  else:
    against_jnp(args.repeats)


if __name__ == "__main__":
  main()
