"""Host and buffer callbacks on GPU operands, one GPU, interleaved in one process.

- ``bp.pure_callback`` (``arrays="numpy"`` and ``"jax"``) against
  ``jax.pure_callback``: the operands live on the GPU, so either way XLA copies
  them to the host, calls NumPy and copies the result back. With one device
  there is no gather to save; this measures what batchpart's per-shard call
  costs on top of jax's.
- ``bp.buffer_callback`` against ``jax.experimental.buffer_callback``: the
  function gets the device buffers in place and works on them with CuPy on
  the call's stream (``ctx.stream``); nothing crosses to the host.

  python benchmarks/callbacks_gpu.py          # on a machine with a CUDA GPU and CuPy
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> int:
  sys.path.insert(0, HERE)
  import jax
  import numpy as np
  from _timing import fmt_time, interleaved

  import batchpart as bp

  gpu = jax.devices("cuda")[0]
  print(f"# Callbacks on GPU operands\n\njax {jax.__version__}, {gpu.device_kind}; "
        "median of interleaved rounds; ratio > 1 means batchpart is faster.\n")

  # ---- host callbacks: eigvalsh of symmetric matrices, and a tiny elementwise call
  print("## Host callbacks (NumPy on the host)\n")
  print("| work | shape | bp numpy | bp jax | jax.pure_callback | ratio (numpy) | ratio (jax) |")
  print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
  rng = np.random.default_rng(0)
  for label, fn, shape, out_shape, nbd in (
      ("np.sin", np.sin, (64,), (64,), 1),
      ("np.sin", np.sin, (1 << 20,), (1 << 20,), 1),
      ("eigvalsh", np.linalg.eigvalsh, (1024, 32, 32), (1024, 32), 1),
  ):
    x = rng.standard_normal(shape).astype(np.float32)
    if label == "eigvalsh":
      x = x + np.swapaxes(x, -1, -2)
    x_gpu = jax.device_put(x, gpu)
    out = jax.ShapeDtypeStruct(out_shape, np.float32)
    host = lambda v, fn=fn: np.asarray(fn(np.asarray(v)), np.float32)
    candidates = {
        "numpy": jax.jit(lambda v, host=host, out=out, nbd=nbd: bp.pure_callback(
            host, out, v, num_batch_dims=nbd, arrays="numpy")),
        "jax": jax.jit(lambda v, host=host, out=out, nbd=nbd: bp.pure_callback(
            host, out, v, num_batch_dims=nbd, arrays="jax")),
        "stock": jax.jit(lambda v, host=host, out=out: jax.pure_callback(
            host, out, v, vmap_method="expand_dims")),
    }
    expected = host(x)
    for f in candidates.values():
      np.testing.assert_allclose(np.asarray(f(x_gpu)), expected, rtol=1e-4, atol=1e-4)
    t = interleaved(candidates, (x_gpu,), repeats=7, min_time=0.05, settle=0.0)
    print(f"| {label} | {shape} | {fmt_time(t['numpy'])} | {fmt_time(t['jax'])} | "
          f"{fmt_time(t['stock'])} | {t['stock'] / t['numpy']:.2f}x | "
          f"{t['stock'] / t['jax']:.2f}x |", flush=True)

  # ---- buffer callbacks: y = 2 x + 1 on the device with CuPy, on the call's stream
  try:
    import cupy
  except ImportError:
    print("\nCuPy is not installed: buffer callbacks skipped.")
    return 0
  from jax.experimental.buffer_callback import buffer_callback

  def scale(ctx, out, x):
    with cupy.cuda.ExternalStream(int(ctx.stream)):
      src = cupy.asarray(x)
      dst = cupy.asarray(out)
      cupy.multiply(src, 2, out=dst)
      dst += 1

  print("\n## Buffer callbacks (CuPy on the device, in place)\n")
  print("| shape | bp.buffer_callback | jax buffer_callback | ratio |")
  print("| --- | ---: | ---: | ---: |")
  for shape in ((64,), (1 << 20,), (4096, 1024)):
    x = rng.standard_normal(shape).astype(np.float32)
    x_gpu = jax.device_put(x, gpu)
    out = jax.ShapeDtypeStruct(shape, np.float32)
    candidates = {
        "bp": jax.jit(bp.buffer_callback(scale, out, num_batch_dims=1)),
        "stock": jax.jit(buffer_callback(scale, out)),
    }
    for f in candidates.values():
      np.testing.assert_allclose(np.asarray(f(x_gpu)), 2 * x + 1, rtol=1e-6)
    t = interleaved(candidates, (x_gpu,), repeats=7, min_time=0.05, settle=0.0)
    print(f"| {shape} | {fmt_time(t['bp'])} | {fmt_time(t['stock'])} | "
          f"{t['stock'] / t['bp']:.2f}x |", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
