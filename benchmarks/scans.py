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
- ``linear attention``: ``batchpart_test_linear_attention`` (causal, a 64 x
  64 state per head, ``S_t = S_{t-1} + k_t v_t^T``, ``o_t = q_t^T S_t``) on
  ``H`` heads of ``T`` steps, ``t`` sharded 8 ways; the same three programs
  (the hand-written one all-gathers the parts' states and adds those before
  its own).
- ``lfilter``: ``scipy.signal.lfilter(b, a, x, zi=zi)`` (a 4th-order
  Butterworth) on ``B x T`` float32, batch over 2 devices and ``t`` over 4:
  stock ``jax.pure_callback`` (one call on device 0, the signal gathered
  there) vs ``bp.pure_callback(..., scan={"t": bp.Scan(state=(1, 1))})``
  (sequential: 4 stages of 2 calls on their parts, ``zf`` handed on).
- ``sequential memory``: the tanh RNN (``batchpart_test_tanh_rnn``) on a long
  sequence, stock vs sequential ``scan=``: per-device bytes from the
  compiled programs' ``memory_analysis()``.

Every program's result is checked against the stock one first (floats
within 1e-4: the fold reassociates the recurrence). The stock programs are
compiled before anything is declared. The machine has 2 cores simulating 8
devices: the numbers compare programs, not hardware.
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


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


def attention_candidates(jax, bt, h: int, t: int, partitioner: str, d: int = 64):
  """Stock, by hand and batchpart programs for causal linear attention."""
  import jax.numpy as jnp
  import numpy as np
  from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
  jax.config.update("jax_use_shardy_partitioner", partitioner == "shardy")
  mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))
  rng = np.random.default_rng(1)
  seq = NamedSharding(mesh, P(None, "x"))
  q, k, v = (jax.device_put((rng.standard_normal((h, t, d)) / 8).astype(np.float32), seq)
             for _ in range(3))
  s0 = jax.device_put(np.zeros((h, d, d), np.float32), NamedSharding(mesh, P()))
  S = jax.ShapeDtypeStruct
  target = "batchpart_test_linear_attention"
  rev = np.int64(0)
  plain = lambda q, k, v, s: jax.ffi.ffi_call(target, (
      S(v.shape, np.float32), S(s.shape, np.float32)))(q, k, v, s, reverse=rev)
  programs = {"stock": jax.jit(plain).lower(q, k, v, s0).compile()}

  def body(q, k, v, s):
    _, part = plain(q, k, v, jnp.zeros_like(s))
    parts = jax.lax.all_gather(part, "x")
    me = jax.lax.axis_index("x")
    before = jnp.sum(jnp.where((jnp.arange(8) < me)[:, None, None, None], parts, 0), 0)
    o, _ = plain(q, k, v, s + before)
    return o, s + jnp.sum(parts, 0)

  by_hand = jax.shard_map(body, mesh=mesh, in_specs=(P(None, "x"),) * 3 + (P(),),
                          out_specs=(P(None, "x"), P()), check_vma=False)
  programs["shard_map"] = jax.jit(by_hand).lower(q, k, v, s0).compile()
  scanned = bt.linear_attention((h, t, d), d, np.float32)
  programs["batchpart"] = jax.jit(lambda q, k, v, s: scanned(q, k, v, s, reverse=rev)).lower(
      q, k, v, s0).compile()
  return programs, (q, k, v, s0)


def lfilter_candidates(jax, b: int, t: int, partitioner: str):
  """Stock jax.pure_callback and bp.pure_callback (sequential scan) running
  scipy's lfilter on a signal split over batch and time."""
  import numpy as np
  from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
  from scipy import signal

  import batchpart as bp
  jax.config.update("jax_use_shardy_partitioner", partitioner == "shardy")
  mesh = jax.make_mesh((2, 4), ("a", "b"), axis_types=(AxisType.Auto,) * 2)
  num, den = signal.butter(4, 0.2)

  def lfilter(x, zi):
    y, zf = signal.lfilter(num, den, np.asarray(x), axis=-1, zi=np.asarray(zi))
    return y.astype(x.dtype), zf.astype(zi.dtype)

  rng = np.random.default_rng(2)
  x = jax.device_put(rng.standard_normal((b, t)).astype(np.float32),
                     NamedSharding(mesh, P("a", "b")))
  zi = jax.device_put(np.zeros((b, 4), np.float32), NamedSharding(mesh, P("a")))
  S = jax.ShapeDtypeStruct
  types = (S((b, t), np.float32), S((b, 4), np.float32))
  programs = {"stock": jax.jit(lambda x, z: jax.pure_callback(lfilter, types, x, z)).lower(
      x, zi).compile()}
  programs["batchpart"] = jax.jit(lambda x, z: bp.pure_callback(
      lfilter, types, x, z, signature="(t),(z)->(t),(z)",
      scan={"t": bp.Scan(state=(1, 1))})).lower(x, zi).compile()
  return programs, (x, zi)


def sequential_memory(jax, bt, b: int, t: int, partitioner: str) -> dict:
  """Per-device bytes (arguments, results and temporaries, from
  ``memory_analysis()``) of the tanh RNN, stock vs sequential ``scan=``."""
  import numpy as np
  from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

  import batchpart as bp
  jax.config.update("jax_use_shardy_partitioner", partitioner == "shardy")
  mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))
  x = jax.device_put(np.zeros((b, t), np.float32), NamedSharding(mesh, P(None, "x")))
  h0 = jax.device_put(np.zeros((b,), np.float32), NamedSharding(mesh, P()))
  S = jax.ShapeDtypeStruct
  types = (S((b, t), np.float32), S((b,), np.float32))
  target = "batchpart_test_tanh_rnn"
  rev = np.int64(0)
  stock = jax.jit(lambda x, h: jax.ffi.ffi_call(target, types)(x, h, w=0.5, reverse=rev))
  rnn = bp.ffi_call(target, types, signature="(t),()->(t),()",
                    scan={"t": bp.Scan(state=(1, 1))})
  ours = jax.jit(lambda x, h: rnn(x, h, w=0.5, reverse=rev))
  out = {}
  for name, f in (("stock", stock), ("batchpart", ours)):
    m = f.lower(x, h0).compile().memory_analysis()
    out[name] = (m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
                 - m.alias_size_in_bytes)
  return out


def pipeline_candidates(jax, bt, b: int, t: int, partitioner: str):
  """The tanh RNN (sequential scan) compiled three ways: stock, ``scan=``
  with its stages pipelined over the batch (what batchpart does), and
  ``scan=`` with one stage per part of the whole batch (pipelining switched
  off in the partitioner for this one compile). The unpipelined program's
  ``w`` differs in its last bit, so that jax compiles it apart."""
  import numpy as np
  from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

  import batchpart as bp
  from batchpart._partition import callbacks, scan
  jax.config.update("jax_use_shardy_partitioner", partitioner == "shardy")
  mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))
  rng = np.random.default_rng(0)
  x = jax.device_put(rng.standard_normal((b, t)).astype(np.float32),
                     NamedSharding(mesh, P(None, "x")))
  h0 = jax.device_put(np.zeros((b,), np.float32), NamedSharding(mesh, P()))
  S = jax.ShapeDtypeStruct
  types = (S((b, t), np.float32), S((b,), np.float32))
  target, rev = "batchpart_test_tanh_rnn", np.int64(0)
  rnn = bp.ffi_call(target, types, signature="(t),()->(t),()",
                    scan={"t": bp.Scan(state=(1, 1))})
  programs = {"stock": jax.jit(lambda x, h: jax.ffi.ffi_call(target, types)(
      x, h, w=0.5, reverse=rev)).lower(x, h0).compile()}
  programs["pipelined"] = jax.jit(lambda x, h: rnn(x, h, w=0.5, reverse=rev)).lower(
      x, h0).compile()
  chunks = scan._chunks
  try:
    scan._chunks = lambda *args: 1
    callbacks._cache.clear()
    programs["one stage per part"] = jax.jit(lambda x, h: rnn(
        x, h, w=float(np.nextafter(0.5, 1)), reverse=rev)).lower(x, h0).compile()
  finally:
    scan._chunks = chunks
    callbacks._cache.clear()
  return programs, (x, h0)


def _header(title: str, columns) -> None:
  """A table's title and header: the partitioner and program columns
  left-aligned, the numbers right-aligned."""
  print(title)
  print("| " + " | ".join(columns) + " |")
  left = sum(c in ("partitioner", "program") for c in columns)
  print("| " + " | ".join(["---"] * left + ["---:"] * (len(columns) - left)) + " |")


def _check(programs, args, tol):
  import numpy as np
  want = programs["stock"](*args)
  for name, f in programs.items():
    for g, w in zip(f(*args), want):
      np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=tol, atol=tol,
                                 err_msg=name)


def _rows(_timing, programs, args, partitioner, repeats, by_hand=True):
  times = _timing.interleaved(programs, args, repeats=repeats)
  for name in programs:
    vs_hand = f" {times[name] / times['shard_map']:.2f}x |" if by_hand else ""
    print(f"| {partitioner} | {name} | {_timing.fmt_time(times[name]).strip()} | "
          f"{times['stock'] / times[name]:.1f}x faster |{vs_hand}", flush=True)


def main(argv):
  sys.path.insert(0, HERE)
  import _timing
  import numpy as np
  jax = _timing.simulated_devices()

  import batchpart.testing as bt
  _timing.steady_allocator()
  bt.register()
  quick = "--quick" in argv
  b, t = (32, 32_768) if quick else (32, 262_144)
  repeats = 3 if quick else 5
  from batchpart import _hlo
  _header(f"linear recurrence, {b} x {t:,} float32, t sharded 8 ways",
          ["partitioner", "program", "time", "vs stock", "vs shard_map",
           "bytes received per device"])
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
  heads, steps = (4, 1024) if quick else (4, 8192)
  _header(f"\nlinear attention, {heads} heads x {steps:,} steps, 64 x 64 state per head, "
        "t sharded 8 ways",
          ["partitioner", "program", "time", "vs stock", "vs shard_map"])
  for partitioner in ("shardy", "gspmd"):
    programs, args = attention_candidates(jax, bt, heads, steps, partitioner)
    _check(programs, args, 1e-3)
    _rows(_timing, programs, args, partitioner, repeats)
  lb, lt = (16, 1 << 16) if quick else (16, 1 << 20)
  _header(f"\nscipy lfilter, {lb} x {lt:,} float32, batch over 2 devices, t over 4 "
        "(sequential)",
          ["partitioner", "program", "time", "vs stock"])
  programs, args = lfilter_candidates(jax, lb, lt, "shardy")
  # The state zf is rounded to float32 between parts (scipy keeps it in
  # float64 within one call): a few ulps.
  _check(programs, args, 1e-4)
  _rows(_timing, programs, args, "shardy", repeats, by_hand=False)
  # Under GSPMD the stock program (jax.pure_callback on device 0 and the
  # all-reduce that replicates its results) aborts on simulated devices: one
  # device never joins the all-reduce. batchpart's program alone.
  programs, args = lfilter_candidates(jax, lb, lt, "gspmd")
  del programs["stock"]
  alone = _timing.interleaved(programs, args, repeats=repeats)["batchpart"]
  print(f"| gspmd | batchpart | {_timing.fmt_time(alone).strip()} | (stock aborts) |",
        flush=True)
  pb, pt = (8, 1 << 15) if quick else (8, 1 << 18)
  _header(f"\nsequential tanh RNN, {pb} x {pt:,} float32, t sharded 8 ways: stages pipelined "
        "over the batch",
          ["partitioner", "program", "time", "vs stock", "vs one stage per part"])
  for partitioner in ("shardy", "gspmd"):
    programs, args = pipeline_candidates(jax, bt, pb, pt, partitioner)
    times = _timing.interleaved(programs, args, repeats=repeats)
    for name in programs:
      print(f"| {partitioner} | {name} | {_timing.fmt_time(times[name]).strip()} | "
            f"{times['stock'] / times[name]:.1f}x faster | "
            f"{times[name] / times['one stage per part']:.2f}x |", flush=True)
  mb, mt = (4, 1 << 18) if quick else (4, 1 << 22)
  _header(f"\nsequential tanh RNN, {mb} x {mt:,} float32, t sharded 8 ways: bytes per device",
          ["partitioner", "stock", "batchpart", "ratio"])
  for partitioner in ("shardy", "gspmd"):
    m = sequential_memory(jax, bt, mb, mt, partitioner)
    print(f"| {partitioner} | {m['stock']:,} | {m['batchpart']:,} | "
          f"{m['stock'] / m['batchpart']:.1f}x less |", flush=True)


if __name__ == "__main__":
  main(sys.argv[1:])
