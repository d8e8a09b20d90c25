"""batchpart.linalg vs jax.numpy.linalg (and pure_callback with NumPy),
measured interleaved in one process.

  python benchmarks/linalg.py            # full grid, writes docs/benchmarks-linalg.md
  python benchmarks/linalg.py --quick    # a few points, for CI-sized runs
  python benchmarks/linalg.py --gpu --dtype float32,float64
                                         # on a GPU: batchpart vs jnp.linalg
  python benchmarks/linalg.py --options  # only section (4)

Sections: (1) one device, batches of 8..2048 matrices of size 8..256, every
op; (2) eight simulated devices, batch-sharded and core-sharded inputs;
(3) batchpart vs jax.pure_callback calling NumPy; (4) the options with their
own LAPACK routines (pivoted and raw QR, gesvd, hermitian SVD, Cholesky solve,
one-triangle eigh and Cholesky) against the jnp/lax/jax.scipy call with the
same option, one device.
"""

from __future__ import annotations

import argparse
import os
import sys

NUM_DEVICES = 8


def _setup(gpu: bool, devices: int = NUM_DEVICES):
  import jax
  if not gpu:
    # With several CPU devices batchpart's kernels run BLAS single-threaded
    # (the devices share the cores): one-device numbers need a 1-device process.
    jax.config.update("jax_num_cpu_devices", devices)
    jax.config.update("jax_cpu_enable_async_dispatch", False)
  return jax


def _ops(jnp, bp):
  """name -> (batchpart fn, jnp fn, numpy fn, input maker(kind))."""
  import numpy as np
  solve_rhs = lambda a: a[..., :, :4]
  return {
      "cholesky": (bp.linalg.cholesky, jnp.linalg.cholesky, np.linalg.cholesky, "spd"),
      "lu": (lambda a: bp.linalg.lu(a)[0], lambda a: __import__("jax").lax.linalg.lu(a)[0],
             None, "general"),
      # Both factors: with only R, XLA drops jax's separate Q kernel.
      "qr": (lambda a: tuple(bp.linalg.qr(a)), lambda a: tuple(jnp.linalg.qr(a)),
             lambda a: np.linalg.qr(a), "general"),
      "eigh": (lambda a: bp.linalg.eigh(a)[0], lambda a: jnp.linalg.eigh(a)[0],
               lambda a: np.linalg.eigh(a)[0], "spd"),
      "svd": (lambda a: bp.linalg.svd(a, compute_uv=False),
              lambda a: jnp.linalg.svd(a, compute_uv=False),
              lambda a: np.linalg.svd(a, compute_uv=False), "general"),
      "triangular_solve": (
          lambda a: bp.linalg.triangular_solve(a, solve_rhs(a)),
          lambda a: __import__("jax").lax.linalg.triangular_solve(
              a, solve_rhs(a), left_side=True, lower=True), None, "spd"),
      "solve": (lambda a: bp.linalg.solve(a, solve_rhs(a)),
                lambda a: jnp.linalg.solve(a, solve_rhs(a)),
                lambda a: np.linalg.solve(a, solve_rhs(a)), "spd"),
  }


def _option_ops(jnp, bp):
  """name -> (batchpart fn, jax fn with the same option, input kind)."""
  import jax
  from jax.lax.linalg import SvdAlgorithm
  rhs = lambda a: a[..., :, :4]
  return {
      "qr pivoting=True": (lambda a: tuple(bp.linalg.qr(a, pivoting=True)),
                           lambda a: jax.lax.linalg.qr(a, pivoting=True, full_matrices=False),
                           "general"),
      "qr mode='raw'": (lambda a: tuple(bp.linalg.qr(a, mode="raw")),
                        lambda a: tuple(jnp.linalg.qr(a, mode="raw")), "general"),
      "svd algorithm=QR": (
          lambda a: bp.linalg.svd(a, compute_uv=False, algorithm=SvdAlgorithm.QR),
          lambda a: jax.lax.linalg.svd(a, compute_uv=False, algorithm=SvdAlgorithm.QR),
          "general"),
      "svd hermitian=True": (lambda a: bp.linalg.svd(a, compute_uv=False, hermitian=True),
                             lambda a: jnp.linalg.svd(a, compute_uv=False, hermitian=True),
                             "spd"),
      "solve assume_a='pos'": (
          lambda a: bp.linalg.solve(a, rhs(a), assume_a="pos"),
          lambda a: jax.scipy.linalg.solve(a, rhs(a), assume_a="pos"), "spd"),
      "eigh symmetrize_input=False": (
          lambda a: bp.linalg.eigh(a, symmetrize_input=False)[0],
          lambda a: jnp.linalg.eigh(a, symmetrize_input=False)[0], "spd"),
      "cholesky symmetrize_input=False": (
          lambda a: bp.linalg.cholesky(a, symmetrize_input=False),
          lambda a: jnp.linalg.cholesky(a, symmetrize_input=False), "spd"),
  }


def _matrices(np, batch, n, kind, seed=0, dtype="float32"):
  x = np.random.default_rng(seed).standard_normal((batch, n, n)).astype(dtype)
  if kind == "spd":
    x = x @ np.swapaxes(x, -1, -2) / n + np.eye(n, dtype=dtype)
  return x


def main(argv=None) -> int:
  parser = argparse.ArgumentParser()
  parser.add_argument("--quick", action="store_true")
  parser.add_argument("--gpu", action="store_true")
  parser.add_argument("--options", action="store_true", help="only section (4)")
  parser.add_argument("--dtype", default="float32",
                      help="comma-separated dtypes of section (1), e.g. float32,float64")
  parser.add_argument("--out", default=None, help="Markdown file for the tables")
  parser.add_argument("--one-device", action="store_true",
                      help="only section (1), in a process with one CPU device")
  args = parser.parse_args(argv)
  jax = _setup(args.gpu, 1 if args.one_device else NUM_DEVICES)
  dtypes = args.dtype.split(",")
  if "float64" in dtypes or "complex128" in dtypes:
    jax.config.update("jax_enable_x64", True)
  import jax.numpy as jnp
  import numpy as np
  from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

  sys.path.insert(0, os.path.dirname(__file__))
  from _timing import fmt_time, interleaved

  import batchpart as bp

  ops = _ops(jnp, bp)
  lines = []

  def emit(line=""):
    print(line, flush=True)
    lines.append(line)

  def emit_timed(cells, ours, other, a):
    """Times ours against other on a and emits a row: cells, both times, other/ours."""
    # One device's grid is small and its calls short, so more rounds are cheap
    # and steady the medians of the microsecond rows.
    repeats = 9 if args.one_device else (3 if args.quick else 5)
    # A GPU call spawns no BLAS threads, so it needs no pause between candidates.
    t = interleaved({"bp": jax.jit(ours), "other": jax.jit(other)}, (a,), repeats=repeats,
                    **({"settle": 0.0, "min_time": 0.05} if args.gpu else {}))
    emit(f"| {cells} | {fmt_time(t['bp'])} | {fmt_time(t['other'])} | "
         f"{t['other'] / t['bp']:.2f}x |")

  def write_out():
    """Writes the tables to --out when it is given."""
    if args.out:
      with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")

  device = jax.devices()[0]
  name = getattr(device, "device_kind", device.platform)
  emit(f"# batchpart.linalg benchmarks\n\njax {jax.__version__}, {device.platform} ({name}), "
       f"{os.cpu_count()} cores; {', '.join(dtypes)}; median of interleaved rounds; "
       "ratio > 1 means batchpart is faster.\n")

  if args.options:
    # (4) options with their own LAPACK routines
    grid = [(128, 8), (128, 32), (8, 128)]
    emit("## Options: batchpart vs the jax call with the same option, one device\n")
    emit("| op | batch | n | batchpart | jax | ratio |")
    emit("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, (ours, theirs, kind) in _option_ops(jnp, bp).items():
      for batch, n in grid:
        a = jax.device_put(_matrices(np, batch, n, kind), device)
        emit_timed(f"{name} | {batch} | {n}", ours, theirs, a)
    write_out()
    return 0

  # (1) one device
  if args.quick:
    grid = [(8, 8), (2048, 8), (128, 64), (8, 256)]
  elif args.gpu:
    # many small matrices (cuSOLVER's batched routines), mid-sized, and a few large ones
    grid = [(2048, 8), (2048, 32), (128, 128), (8, 256), (4, 1024)]
  else:
    grid = [(b, n) for n in (8, 32, 128, 256) for b in (8, 128, 2048)
            if b * n ** 3 <= 2048 * 128 ** 3]
  emit("## One device: batchpart vs jnp.linalg\n")
  emit("| op | dtype | batch | n | batchpart | jnp.linalg | ratio |")
  emit("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
  for name, (ours, theirs, _, kind) in ops.items():
    for dtype in dtypes:
      for batch, n in grid:
        a = jax.device_put(_matrices(np, batch, n, kind, dtype=dtype), device)
        emit_timed(f"{name} | {dtype} | {batch} | {n}", ours, theirs, a)

  if not args.gpu and not args.one_device:
    # (2) eight devices
    mesh = jax.make_mesh((NUM_DEVICES,), ("x",), axis_types=(AxisType.Auto,))
    batch, n = (64, 32) if args.quick else (512, 64)
    emit(f"\n## {NUM_DEVICES} simulated devices: batch {batch} of {n}x{n}\n")
    emit("| op | input sharding | batchpart | jnp.linalg | ratio |")
    emit("| --- | --- | ---: | ---: | ---: |")
    for name, (ours, theirs, _, kind) in ops.items():
      for label, spec in (("batch", P("x")), ("core", P(None, "x"))):
        a = jax.device_put(_matrices(np, batch, n, kind), NamedSharding(mesh, spec))
        emit_timed(f"{name} | {label}-sharded", ours, theirs, a)

    # (3) pure_callback with NumPy
    batch, n = (256, 16) if args.quick else (1024, 32)
    emit(f"\n## batchpart vs jax.pure_callback(NumPy), one device, batch {batch} of "
         f"{n}x{n}\n")
    emit("| op | batchpart | pure_callback | ratio |")
    emit("| --- | ---: | ---: | ---: |")
    for name, (ours, _, numpy_fn, kind) in ops.items():
      if numpy_fn is None:
        continue
      a = jax.device_put(_matrices(np, batch, n, kind), device)
      out = jax.eval_shape(ours, a)
      callback = lambda a, numpy_fn=numpy_fn, out=out: jax.pure_callback(
          lambda x: jax.tree.map(lambda r, o: np.asarray(r, o.dtype),
                                 tuple(numpy_fn(np.asarray(x))) if isinstance(out, tuple)
                                 else numpy_fn(np.asarray(x)), out),
          out, a, vmap_method="expand_dims")
      emit_timed(name, ours, callback, a)

  write_out()
  return 0


if __name__ == "__main__":
  sys.exit(main())
