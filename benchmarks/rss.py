"""Resident memory over many calls and many compilations (docs/reliability.md).

Two phases on 8 simulated CPU devices, RSS read from /proc/self/status:

  calls     one jitted batchpart program (batch-sharded bp.linalg.cholesky and
            test softmax, a core-sharded softmax) called --calls times after
            a warm-up; RSS sampled every --every calls.
  compiles  --compiles distinct programs (softmax over a new core size each
            time, so every one is a new lowering and a new XLA compile); RSS
            and batchpart's own state (derived targets registered, entries
            in the bounded partition cache) sampled as it goes.
            --clear-caches N calls jax.clear_caches() every N compiles, to
            tell jax's own executable caches from batchpart's state.

Usage::

  python benchmarks/rss.py                               # 10k calls, 1k compiles
  python benchmarks/rss.py --calls 2000 --compiles 200   # quicker
  python benchmarks/rss.py --phase compiles --clear-caches 100

Prints one line per sample and a summary (start, end, max, change in %).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time


def rss_mib() -> float:
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith("VmRSS:"):
        return int(line.split()[1]) / 1024
  raise RuntimeError("no VmRSS in /proc/self/status")


def deep_size(obj, seen=None) -> int:
  """Approximate bytes held by `obj` and everything it references (containers
  and dataclass fields only)."""
  seen = set() if seen is None else seen
  if id(obj) in seen:
    return 0
  seen.add(id(obj))
  size = sys.getsizeof(obj)
  if isinstance(obj, dict):
    size += sum(deep_size(k, seen) + deep_size(v, seen) for k, v in obj.items())
  elif isinstance(obj, (list, tuple, set, frozenset)):
    size += sum(deep_size(x, seen) for x in obj)
  elif hasattr(obj, "__dataclass_fields__"):
    size += sum(deep_size(getattr(obj, f), seen) for f in obj.__dataclass_fields__)
  return size


def _summary(name: str, samples: list[tuple[int, float]]) -> dict:
  start, end = samples[0][1], samples[-1][1]
  peak = max(r for _, r in samples)
  out = {"phase": name, "start_mib": round(start, 1), "end_mib": round(end, 1),
         "max_mib": round(peak, 1), "change_pct": round(100 * (end - start) / start, 2),
         "max_change_pct": round(100 * (peak - start) / start, 2)}
  return out


def phase_calls(args, mesh) -> dict:
  import jax
  import numpy as np
  from jax.sharding import NamedSharding, PartitionSpec as P

  import batchpart as bp
  from batchpart import testing as kernels

  r = np.random.default_rng(0)
  m = r.standard_normal((64, 8, 8)).astype(np.float32)
  spd = m @ np.swapaxes(m, -1, -2) + 8 * np.eye(8, dtype=np.float32)
  a = jax.device_put(spd, NamedSharding(mesh, P("x")))
  x = jax.device_put(r.standard_normal((64, 32)).astype(np.float32),
                     NamedSharding(mesh, P("x")))
  xc = jax.device_put(r.standard_normal((64, 32)).astype(np.float32),
                      NamedSharding(mesh, P(None, "x")))

  @jax.jit
  def program(a, x, xc):
    return bp.linalg.cholesky(a), kernels.softmax(x)[0], kernels.softmax(xc)[1]

  expected = np.linalg.cholesky(spd)
  for _ in range(args.warmup):
    jax.block_until_ready(program(a, x, xc))
  gc.collect()
  samples = [(0, rss_mib())]
  t0 = time.perf_counter()
  for i in range(1, args.calls + 1):
    out = jax.block_until_ready(program(a, x, xc))
    if i % args.every == 0:
      samples.append((i, rss_mib()))
      print(f"calls {i:6d}  rss {samples[-1][1]:8.1f} MiB  "
            f"{(time.perf_counter() - t0) / i * 1e3:.2f} ms/call", flush=True)
  np.testing.assert_allclose(np.asarray(out[0]), expected, rtol=1e-4, atol=1e-4)
  out = _summary("calls", samples)
  print(f"SUMMARY {out}", flush=True)
  return out


def phase_compiles(args, mesh) -> dict:
  import jax
  import numpy as np
  from jax.sharding import NamedSharding, PartitionSpec as P

  from batchpart import testing as kernels
  from batchpart._partition import callbacks, targets

  x_base = np.random.default_rng(1).standard_normal((16, args.compiles + 8))
  x_base = x_base.astype(np.float32)

  def compile_and_run(n):
    xs = jax.device_put(x_base[:, :n], NamedSharding(mesh, P("x")))
    f = jax.jit(lambda x: kernels.softmax(x))  # a new function: a new compile
    y, _ = f(xs)
    np.testing.assert_allclose(np.asarray(y).sum(-1), 1, rtol=1e-4)

  for n in range(1, args.warmup_compiles + 1):
    compile_and_run(n)
  gc.collect()
  samples = [(0, rss_mib())]

  def state():
    with callbacks._cache_lock:
      cached = len(callbacks._cache)
      size = deep_size(callbacks._cache)
    return {**targets.registered_counts(), "partition_cache": cached,
            "partition_cache_kib": round(size / 1024, 1)}

  t0 = time.perf_counter()
  for i in range(1, args.compiles + 1):
    compile_and_run(args.warmup_compiles + i)
    if args.clear_caches and i % args.clear_caches == 0:
      jax.clear_caches()
      gc.collect()
    if i % max(1, args.compiles // 20) == 0:
      samples.append((i, rss_mib()))
      print(f"compiles {i:5d}  rss {samples[-1][1]:8.1f} MiB  batchpart {state()}  "
            f"{(time.perf_counter() - t0) / i:.3f} s/compile", flush=True)
  out = _summary("compiles", samples)
  out["batchpart_state"] = state()
  out["rss_kib_per_compile"] = round((samples[-1][1] - samples[0][1]) * 1024 /
                                     args.compiles, 1)
  print(f"SUMMARY {out}", flush=True)
  return out


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--phase", choices=["calls", "compiles", "both"], default="both")
  p.add_argument("--calls", type=int, default=10_000)
  p.add_argument("--warmup", type=int, default=500)
  p.add_argument("--every", type=int, default=500)
  p.add_argument("--compiles", type=int, default=1000)
  p.add_argument("--warmup-compiles", type=int, default=20)
  p.add_argument("--clear-caches", type=int, default=0, metavar="N")
  args = p.parse_args(argv)

  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             " --xla_force_host_platform_device_count=8").strip()
  import jax
  from jax.sharding import AxisType

  import batchpart.testing
  batchpart.testing.register()
  mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))
  print(f"jax {jax.__version__}, {jax.device_count()} devices, async dispatch "
        f"{jax.config.read('jax_cpu_enable_async_dispatch')}", flush=True)
  if args.phase in ("calls", "both"):
    phase_calls(args, mesh)
  if args.phase in ("compiles", "both"):
    phase_compiles(args, mesh)
  return 0


if __name__ == "__main__":
  sys.exit(main())
