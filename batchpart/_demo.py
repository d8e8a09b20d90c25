"""The demo: what XLA does with an FFI call on sharded inputs, with and
without batchpart, on simulated CPU devices."""

from __future__ import annotations

import time


def _configure(num_devices: int) -> None:
  import jax
  jax.config.update("jax_num_cpu_devices", num_devices)
  # XLA's CPU runtime can hang when many collectives and FFI calls run with
  # async dispatch on simulated devices (docs/faq.md); the demo runs
  # programs back to back, so it dispatches synchronously.
  jax.config.update("jax_cpu_enable_async_dispatch", False)


def _describe(f, *args) -> tuple[str, str]:
  import jax
  from batchpart import _hlo
  text = jax.jit(f).lower(*args).compile().as_text()
  calls = [c for c in _hlo.custom_calls(text) if c.target and "softmax" in c.target]
  shapes = ", ".join(str(t) for c in calls for t in c.operand_types)
  colls = _hlo.collectives(text)
  kinds = {}
  for c in colls:
    kinds[c.opcode] = kinds.get(c.opcode, 0) + sum(t.nbytes for t in c.result_types)
  collectives = ", ".join(f"{k} ({v / 1024:.0f} KiB)" for k, v in sorted(kinds.items()))
  return shapes, collectives or "none"


def _time(f, *args, repeats: int) -> float:
  import jax
  g = jax.jit(f)
  jax.block_until_ready(g(*args))
  best = float("inf")
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(g(*args))
    best = min(best, time.perf_counter() - t0)
  return best


def run(*, num_devices: int = 8, repeats: int = 20) -> int:
  _configure(num_devices)
  import jax
  import numpy as np
  from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

  import batchpart.testing as kernels
  from batchpart import _core

  kernels.register()
  jax.ffi.register_ffi_target("demo_plain_softmax", _core.testing.handlers()["softmax"])

  def plain(x):
    return jax.ffi.ffi_call("demo_plain_softmax", (
        jax.ShapeDtypeStruct(x.shape, x.dtype),
        jax.ShapeDtypeStruct(x.shape[:-1], x.dtype)))(x)

  mesh = jax.make_mesh((num_devices,), ("x",), axis_types=(AxisType.Auto,))
  x = np.random.default_rng(0).standard_normal((4096, 512), dtype=np.float32)
  print(f"batchpart demo: row-wise softmax FFI kernel, input {x.shape} float32, "
        f"{num_devices} simulated CPU devices (jax {jax.__version__})\n")
  header = f"{'input sharding':<16} {'call':<22} {'per-device operand':<20} " \
           f"{'collectives':<34} {'time':>9}"
  for label, spec in (("batch-sharded", P("x", None)), ("core-sharded", P(None, "x"))):
    xs = jax.device_put(x, NamedSharding(mesh, spec))
    print(f"[{label}] compiling and timing ...", flush=True)
    print(header)
    times = {}
    for name, f in (("jax.ffi.ffi_call", plain), ("batchpart.ffi_call", kernels.softmax)):
      shapes, collectives = _describe(f, xs)
      times[name] = _time(f, xs, repeats=repeats)
      print(f"{label:<16} {name:<22} {shapes:<20} {collectives:<34} "
            f"{times[name] * 1e3:7.2f}ms")
      np.testing.assert_allclose(jax.jit(f)(xs)[0], kernels.softmax_reference(x)[0],
                                 rtol=1e-5, atol=1e-6)
    print(f"{'':<16} speed-up of batchpart over plain ffi_call: "
          f"{times['jax.ffi.ffi_call'] / times['batchpart.ffi_call']:.1f}x\n")
  print("Both calls give the NumPy result; batchpart runs 1/"
        f"{num_devices} of the batch per device.")
  return 0
