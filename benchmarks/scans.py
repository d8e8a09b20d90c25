"""Scanned dims (``scan=``) on 8 simulated CPU devices: stock jax vs a
hand-written two-pass ``jax.shard_map`` vs batchpart, interleaved in one
process, under both partitioners.

  python benchmarks/scans.py            # 32 x 262,144 float32
  python benchmarks/scans.py --quick    # 32 x 32,768, fewer repeats

- ``linear recurrence``: ``batchpart_test_linear_scan`` (``h[t] = a[t]
  h[t-1] + x[t]``, returning ``(y, h_T, prod a)``) on ``B x T`` float32,
  ``t`` sharded 8 ways. Stock: a plain ``jax.ffi.ffi_call``, which XLA
  gathers onto every device. By hand: a ``shard_map`` that runs the kernel
  on its part from zero, all-gathers ``(h_T, prod a)``, folds the parts
  before its own and runs the kernel again from that state (what LASP-2 and
  RecurrentGemma write). batchpart: ``bp.ffi_call(..., scan={"t":
  bp.Scan(state=(2, 1), merge=..., apply=...)})``.

Every program's result is checked against the stock one first (floats
within 1e-4: the fold reassociates the recurrence). The stock programs are
compiled before anything is declared. The machine has 2 cores simulating 8
devices: the numbers compare programs, not hardware.
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def _setup():
  sys.path.insert(0, HERE)
  import jax
  jax.config.update("jax_num_cpu_devices", 8)
  jax.config.update("jax_cpu_enable_async_dispatch", False)
  return jax


def candidates(jax, bt, b: int, t: int, partitioner: str):
  """The compiled programs under ``partitioner`` and their inputs."""
  import jax.numpy as jnp
  import numpy as np
  from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
  jax.config.update("jax_use_shardy_partitioner", partitioner == "shardy")
  mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))
  rng = np.random.default_rng(0)
  seq = NamedSharding(mesh, P(None, "x"))
  a = jax.device_put(rng.uniform(0.9, 1.0, (b, t)).astype(np.float32), seq)
  x = jax.device_put(rng.standard_normal((b, t)).astype(np.float32), seq)
  h0 = jax.device_put(rng.standard_normal((b,)).astype(np.float32), NamedSharding(mesh, P()))
  S = jax.ShapeDtypeStruct
  target = "batchpart_test_linear_scan"
  types = lambda shape: (S(shape, np.float32), S(shape[:-1], np.float32),
                         S(shape[:-1], np.float32))
  rev = np.int64(0)
  plain = lambda a, x, h: jax.ffi.ffi_call(target, types(a.shape))(a, x, h, reverse=rev)
  # Stock first, before any declaration is made in this process.
  programs = {"stock": jax.jit(plain).lower(a, x, h0).compile()}

  def body(a, x, h):
    _, h_t, prod = plain(a, x, jnp.zeros_like(h))
    hs = jax.lax.all_gather(h_t, "x")
    ps = jax.lax.all_gather(prod, "x")
    me = jax.lax.axis_index("x")
    state = h
    for p in range(8):   # the parts before this one, folded onto h0
      state = jnp.where(p < me, ps[p] * state + hs[p], state)
    y, _, _ = plain(a, x, state)
    final = h
    for p in range(8):
      final = ps[p] * final + hs[p]
    total = ps[0]
    for p in range(1, 8):
      total = total * ps[p]
    return y, final, total

  by_hand = jax.shard_map(body, mesh=mesh, in_specs=(P(None, "x"), P(None, "x"), P()),
                          out_specs=(P(None, "x"), P(), P()), check_vma=False)
  programs["shard_map"] = jax.jit(by_hand).lower(a, x, h0).compile()
  scanned = bt.linear_scan((b, t), np.float32)
  programs["batchpart"] = jax.jit(lambda a, x, h: scanned(a, x, h, reverse=rev)).lower(
      a, x, h0).compile()
  return programs, (a, x, h0)


def main(argv):
  jax = _setup()
  import _timing
  import numpy as np

  import batchpart.testing as bt
  _timing.steady_allocator()
  bt.register()
  quick = "--quick" in argv
  b, t = (32, 32_768) if quick else (32, 262_144)
  repeats = 3 if quick else 5
  from batchpart import _hlo
  print(f"linear recurrence, {b} x {t:,} float32, t sharded 8 ways")
  print("| partitioner | program | time | vs stock | vs shard_map | bytes received per device |")
  print("| --- | --- | ---: | ---: | ---: | ---: |")
  for partitioner in ("shardy", "gspmd"):
    programs, args = candidates(jax, bt, b, t, partitioner)
    want = programs["stock"](*args)
    for name, f in programs.items():
      got = f(*args)
      for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=1e-4,
                                   err_msg=name)
    times = _timing.interleaved(programs, args, repeats=repeats)
    for name, f in programs.items():
      received = sum(sum(r.nbytes for r in c.result_types)
                     for c in _hlo.collectives(f.as_text()))
      print(f"| {partitioner} | {name} | {_timing.fmt_time(times[name]).strip()} | "
            f"{times['stock'] / times[name]:.1f}x faster | "
            f"{times[name] / times['shard_map']:.2f}x | {received:,} |", flush=True)


if __name__ == "__main__":
  main(sys.argv[1:])
