"""Reduced core dims (``reduce=``) on 8 simulated CPU devices: stock jax vs
a hand-written ``jax.shard_map`` + ``jax.lax.psum`` vs batchpart, interleaved
in one process, under both partitioners (Shardy, GSPMD).

  python benchmarks/reductions.py          # writes docs/benchmarks-reductions.md
  python benchmarks/reductions.py --quick

Each (case, partitioner) runs in a child process of its own
(``_timing.parts_in_children``): the partitioner is process-wide config and
``bp.partition_primitive`` wraps a primitive process-wide. In each child the
stock, shard_map and one-device programs are compiled first, then the
primitive is declared and the batchpart program compiled; compiled
executables never change, so the four are timed side by side.

- ``nufft1``: jax-finufft 2-D type 1 (complex128), points sharded
  ``P("x")``. Stock jax all-gathers the points and every device transforms
  all of them; batchpart declares the points reduced
  (``reduce={"j": "sum"}``): each device transforms its own points and one
  all-reduce of the grid sums them.
- ``grad``: ``jax.grad`` of ``sum(|nufft2(f, x, y)|^2)`` with respect to the
  grid, points sharded. The forward type 2 is independent per point (the
  points are a batch dim behind a ``...``); its transpose is a type 1 over
  the same sharded points, i.e. a reduced call.
- ``reduce_rows``: batchpart's test kernel ``batchpart_test_reduce_rows``
  (``"(n,k),(n)->(k)"``, a weighted column sum) with n sharded, vs a plain
  ``jax.ffi.ffi_call`` of the same target (stock: gathers x). Also checks
  the compiled batchpart program's only collective is one all-reduce of one
  result's bytes.

FINUFFT threads: every 8-device program runs ``Opts(nthreads=1)`` per call.
The 8 simulated devices are 8 threads on this machine's 2 cores, each
running its device's FINUFFT call at once; FINUFFT's default (all cores per
call) would start 8 x 2 OpenMP threads on 2 cores. One thread per call is
the fair setting for all three, and the same function (same ``opts``) runs
stock and under batchpart. The one-device program is the reference for
"no distribution at all" and runs FINUFFT's default, all cores. Every
program pins FINUFFT's upsampling factor (``upsampfac=2.0``): its default
picks one from the point density, so a device's part of the points could be
transformed with another factor than all of them, and the results would then
differ by about FINUFFT's eps rather than by rounding.

Every call blocks until its result is ready (see ``_time``): back-to-back
dispatches of a fast program with an all-reduce hang XLA's CPU runtime on 8
simulated devices, with or without batchpart.
"""

from __future__ import annotations

import functools
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DOCS = os.path.join(os.path.dirname(HERE), "docs")
PARTITIONERS = ("shardy", "gspmd")
CANDIDATES = ("stock", "shard_map", "batchpart", "one_device")


def _setup(partitioner: str):
  sys.path.insert(0, HERE)
  import jax
  jax.config.update("jax_num_cpu_devices", 8)
  jax.config.update("jax_enable_x64", True)
  jax.config.update("jax_use_shardy_partitioner", partitioner == "shardy")
  # XLA's CPU runtime has been seen to hang on simulated devices running
  # programs that mix collectives and FFI calls with async dispatch on
  # (docs/faq.md); every candidate dispatches synchronously alike.
  jax.config.update("jax_cpu_enable_async_dispatch", False)
  from jax.sharding import AxisType
  return jax, jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))


def collectives(compiled) -> list[tuple[str, int]]:
  """(kind, bytes of its result) of each collective in a compiled program."""
  from batchpart import _hlo
  return [(c.opcode, sum(t.nbytes for t in c.result_types))
          for c in _hlo.collectives(compiled.as_text())]


def instruction_summary(compiled) -> list:
  """The compiled program's instructions as (opcode, target, result bytes),
  sorted, leaving out those that move no data (parameters, bitcasts,
  tuples, copies): two programs with equal summaries do the same work, up to
  where a bitcast sits."""
  from batchpart import _hlo
  skip = {"parameter", "bitcast", "tuple", "get-tuple-element", "copy"}
  return sorted((i.opcode, i.target or "", sum(t.nbytes for t in i.result_types))
                for i in _hlo.instructions(compiled.as_text()) if i.opcode not in skip)


def describe(colls) -> str:
  if not colls:
    return "none"
  size = lambda b: (f"{b / 2**20:.1f} MiB" if b >= 2**20 else
                    f"{b / 2**10:.1f} KiB" if b >= 2**10 else f"{b} B")
  return ", ".join(f"{kind} {size(b)}" for kind, b in colls)


def _time(jax, compiled: dict, args, one_device_args, want, *, quick: bool, rtol: dict):
  """Checks every candidate's value against ``want`` (to ``rtol[name]``, of
  the largest element), then times them interleaved; the one-device
  candidate runs on its own (unsharded) args."""
  import numpy as np
  from _timing import interleaved

  # Each call blocks until its result is ready. Dispatched back to back
  # (``interleaved`` loops without blocking, ~50 calls of a fast program),
  # a program with an all-reduce hangs XLA's CPU runtime on 8 simulated
  # devices: some devices never reach the rendezvous (plain jax, no
  # batchpart: a ``shard_map`` psum of ``x.sum(0)`` does it too).
  block = jax.block_until_ready
  calls = {name: (lambda *_, c=c: block(c(*one_device_args))) if name == "one_device"
           else (lambda *a, c=c: block(c(*a))) for name, c in compiled.items()}
  for name, f in calls.items():
    got = np.asarray(f(*args))
    np.testing.assert_allclose(got, want, rtol=rtol[name], atol=rtol[name] * np.abs(want).max(),
                               err_msg=name)
  return interleaved(calls, args, repeats=3 if quick else 9)


def _row(case, shape, partitioner, times, compiled, **extra):
  same = instruction_summary(compiled["batchpart"]) == instruction_summary(compiled["shard_map"])
  row = {"case": case, "shape": shape, "partitioner": partitioner,
         **{f"{n}_s": times[n] for n in CANDIDATES},
         "collectives": {n: collectives(compiled[n]) for n in ("stock", "shard_map", "batchpart")},
         "same_program_as_shard_map": same, **extra}
  print({k: v for k, v in row.items() if k != "collectives"}, flush=True)
  return row


def _finufft_declarations(jax_finufft_ops, grad: bool):
  """Type 1 with its points reduced; for the gradient also type 2 with its
  points as a (non-leading) batch dim. Shapes as jax-finufft emits them for
  a 2-D transform: type 1 operands (n_tot, n_transf, n_j), then the points
  in reversed order, each (n_tot, n_j), result (n_tot, n_transf, *modes);
  type 2 operands (n_tot, n_transf, *modes), points, result
  (n_tot, n_transf, n_j)."""
  import numpy as np

  import batchpart as bp

  def type1(attrs, batch, core):
    return {"n_tot": np.int64(np.prod(batch)), "n_j": np.int64(core["j"])}

  def type2(attrs, batch):
    return {"n_j": np.int64(np.prod(batch))}

  bp.partition_primitive(jax_finufft_ops.nufft1_p, signature="(T,j),(j),(j)->(T,m,k)",
                         reduce={"j": "sum"}, shard_attributes=type1)
  if grad:
    bp.partition_primitive(jax_finufft_ops.nufft2_p,
                           signature="(t,T,m,k),(t,...),(t,...)->(t,T,...)",
                           shard_attributes=type2)


def _points(np, n: int, modes: int):
  r = np.random.default_rng(0)
  x, y = (r.uniform(-np.pi, np.pi, n) for _ in range(2))
  c = r.standard_normal(n) + 1j * r.standard_normal(n)
  f = r.standard_normal((modes, modes)) + 1j * r.standard_normal((modes, modes))
  return c, x, y, f


def run_finufft(partitioner: str, grad: bool, quick: bool) -> list[dict]:
  jax, mesh = _setup(partitioner)
  try:
    import jax_finufft
  except ImportError:
    print("jax_finufft missing: no finufft rows (pip install jax-finufft)", flush=True)
    return []
  import jax.numpy as jnp
  import numpy as np
  from jax.sharding import NamedSharding, PartitionSpec as P
  from jax_finufft import ops

  n, modes = (80_000, 64) if quick else (800_000, 128)
  c, x, y, f = _points(np, n, modes)
  # upsampfac pinned (FINUFFT's default 0 picks it from the point density,
  # so a device's part of the points could get another one than the whole:
  # results then differ by about eps, not by rounding).
  one = jax_finufft.options.Opts(nthreads=1, upsampfac=2.0)
  all_cores = jax_finufft.options.Opts(upsampfac=2.0)
  points = NamedSharding(mesh, P("x"))
  dev0 = jax.devices()[0]
  if grad:
    def loss(f, x, y, opts=one):
      return jnp.sum(jnp.abs(jax_finufft.nufft2(f, x, y, opts=opts)) ** 2)

    fn = jax.grad(loss)
    by_hand = jax.shard_map(lambda f, x, y: jax.lax.psum(fn(f, x, y), "x"), mesh=mesh,
                            in_specs=(P(), P("x"), P("x")), out_specs=P())
    one_device = jax.grad(functools.partial(loss, opts=all_cores))
    args = (jax.device_put(f, NamedSharding(mesh, P())), jax.device_put(x, points),
            jax.device_put(y, points))
    host = (f, x, y)
    case = "jax-finufft grad of sum(|nufft2|^2) w.r.t. the grid (type 2 + type 1)"
  else:
    fn = lambda c, x, y: jax_finufft.nufft1((modes, modes), c, x, y, opts=one)
    by_hand = jax.shard_map(lambda c, x, y: jax.lax.psum(fn(c, x, y), "x"), mesh=mesh,
                            in_specs=P("x"), out_specs=P())
    one_device = lambda c, x, y: jax_finufft.nufft1((modes, modes), c, x, y, opts=all_cores)
    args = tuple(jax.device_put(a, points) for a in (c, x, y))
    host = (c, x, y)
    case = "jax-finufft nufft1 2-D type 1"
  one_args = tuple(jax.device_put(a, dev0) for a in host)
  compile_ = lambda g, a: jax.jit(g).lower(*a).compile()
  compiled = {"stock": compile_(fn, args), "shard_map": compile_(by_hand, args),
              "one_device": compile_(one_device, one_args)}
  want = np.asarray(compiled["one_device"](*one_args))
  _finufft_declarations(ops, grad)
  compiled["batchpart"] = compile_(fn, args)
  times = _time(jax, compiled, args, one_args, want, quick=quick,
                rtol=dict.fromkeys(compiled, 1e-6))
  shape = f"{n} points, {modes}x{modes} grid, complex128"
  return [_row(case, shape, partitioner, times, compiled)]


def run_reduce_rows(partitioner: str, quick: bool) -> list[dict]:
  jax, mesh = _setup(partitioner)
  import numpy as np
  from jax.sharding import NamedSharding, PartitionSpec as P

  from batchpart import testing

  testing.register()
  target = "batchpart_test_reduce_rows"
  n, k = (2**16, 16) if quick else (2**19, 16)
  r = np.random.default_rng(1)
  x = r.standard_normal((n, k)).astype(np.float32)
  w = r.standard_normal(n).astype(np.float32)
  attrs = {"op": np.int64(testing.REDUCE_OPS["sum"]), "rows": np.int64(-1)}

  def plain(x, w):
    return jax.ffi.ffi_call(target, jax.ShapeDtypeStruct(x.shape[-1:], x.dtype))(x, w, **attrs)

  by_hand = jax.shard_map(lambda x, w: jax.lax.psum(plain(x, w), "x"), mesh=mesh,
                          in_specs=P("x"), out_specs=P())
  rows = NamedSharding(mesh, P("x"))
  args = (jax.device_put(x, rows), jax.device_put(w, rows))
  one_args = tuple(jax.device_put(a, jax.devices()[0]) for a in (x, w))
  compile_ = lambda g, a: jax.jit(g).lower(*a).compile()
  compiled = {"stock": compile_(plain, args), "shard_map": compile_(by_hand, args),
              "batchpart": compile_(lambda x, w: testing.reduce_rows(x, w), args),
              "one_device": compile_(plain, one_args)}
  colls = {name: collectives(compiled[name]) for name in compiled}
  result_bytes = k * x.dtype.itemsize
  only_all_reduce = [kind for kind, _ in colls["batchpart"]] == ["all-reduce"]
  one_result = only_all_reduce and colls["batchpart"][0][1] == result_bytes
  if not one_result:
    print(f"reduce_rows under batchpart: expected one all-reduce of {result_bytes} B, got "
          f"{colls['batchpart']}", flush=True)
  want = testing.reduce_rows_reference(x, w)
  times = _time(jax, compiled, args, one_args, want, quick=quick,
                rtol=dict.fromkeys(compiled, 1e-4))
  return [_row(f"FFI column sum `{target}` \"(n,k),(n)->(k)\"", f"x: {n} x {k} float32",
               partitioner, times, compiled, result_bytes=result_bytes,
               one_all_reduce_of_one_result=one_result)]


PARTS = {}
for _p in PARTITIONERS:
  PARTS[f"nufft1-{_p}"] = functools.partial(run_finufft, _p, False)
  PARTS[f"grad-{_p}"] = functools.partial(run_finufft, _p, True)
  PARTS[f"reduce_rows-{_p}"] = functools.partial(run_reduce_rows, _p)


def _ms(seconds: float) -> str:
  return f"{seconds * 1e3:.2f} ms"


def table(rows) -> list[str]:
  lines = ["| case | shape | stock | shard_map + psum | batchpart | one device | "
           "speed-up vs stock | batchpart / shard_map | collectives: stock | "
           "collectives: batchpart | same program as shard_map |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
  for r in rows:
    lines.append(
        f"| {r['case']} | {r['shape']} | {_ms(r['stock_s'])} | {_ms(r['shard_map_s'])} | "
        f"{_ms(r['batchpart_s'])} | {_ms(r['one_device_s'])} | "
        f"{r['stock_s'] / r['batchpart_s']:.2f}x | "
        f"{r['batchpart_s'] / r['shard_map_s']:.2f} | {describe(r['collectives']['stock'])} | "
        f"{describe(r['collectives']['batchpart'])} | "
        f"{'yes' if r['same_program_as_shard_map'] else 'no'} |")
  return lines


def checks(rows) -> list[str]:
  """The targets: batchpart >= 5x stock and within 1.1x of shard_map + psum
  on the type 1 row; the column sum's one all-reduce of one result."""
  out = []
  for r in rows:
    p = r["partitioner"]
    if r["case"].startswith("jax-finufft nufft1"):
      speed, vs = r["stock_s"] / r["batchpart_s"], r["batchpart_s"] / r["shard_map_s"]
      out.append(f"- {p}, type 1: batchpart {speed:.2f}x stock (target >= 5x: "
                 f"{'met' if speed >= 5 else 'NOT met'}), {vs:.2f}x shard_map + psum "
                 f"(target <= 1.1x: {'met' if vs <= 1.1 else 'NOT met'})")
    if "one_all_reduce_of_one_result" in r:
      verdict = "" if r["one_all_reduce_of_one_result"] else "NOT "
      out.append(f"- {p}, column sum: the batchpart program's collectives: "
                 f"{describe(r['collectives']['batchpart'])}; one result is "
                 f"{r['result_bytes']} B: {verdict}one all-reduce of one result")
  return out


def write(rows, quick: bool, load: str) -> str:
  lines = [
      "# Reductions benchmark: a sharded reduced dim, stock vs shard_map + psum vs batchpart",
      "",
      "8 simulated CPU devices (`jax_num_cpu_devices`) on a 2-core machine shared with other",
      "work; the four programs of each row are compiled in one process and timed interleaved",
      "(`benchmarks/reductions.py`" + (" --quick" if quick else "") + ", "
      "`benchmarks/_timing.py`: median of rounds A B C D, B C D A, ...; each call blocks",
      "until its result is ready). Every value is checked against the unsharded result",
      "before timing (relative 1e-6 of the largest element for complex128, 1e-4 for the",
      "float32 column sum). Machine load (`uptime`) at the start and end of the run:",
      f"{load}. The machine is shared: treat ratios within about 10-20% as noise.",
      "",
  ]
  for p in PARTITIONERS:
    these = [r for r in rows if r["partitioner"] == p]
    if not these:
      continue
    lines += [f"## {'Shardy (default)' if p == 'shardy' else 'GSPMD'}", "", *table(these), "",
              *checks(these), ""]
  lines += [
      "## The columns and rows",
      "",
      "- **stock**: the function as written, no batchpart. The FFI call has no sharding rule,",
      "  so XLA all-gathers the sharded operands onto every device and each device runs the",
      "  whole call (8 times the work, plus the gather).",
      "- **shard_map + psum**: the best hand-written program: `jax.shard_map` over the points",
      "  (rows), each device calls the kernel on its own part, `jax.lax.psum` sums the results.",
      "- **batchpart**: the stock function unchanged, with the primitive declared",
      "  (`bp.partition_primitive(..., reduce={\"j\": \"sum\"})`; the column sum through",
      "  `batchpart.testing.reduce_rows`, a `bp.ffi_call` with `reduce={\"n\": \"sum\"}`). It",
      "  compiles to the shard_map program: the kernel on each device's part, one all-reduce.",
      "  *same program as shard_map*: the two compiled programs have the same instructions",
      "  (opcode, custom-call target, result bytes; parameters, bitcasts, tuples and copies",
      "  left out), so the spread of `batchpart / shard_map` around 1 is timing noise.",
      "- **one device**: the same computation unsharded on one device, FINUFFT at its default",
      "  threads (both cores): what the work costs without distribution on this machine.",
      "",
      "- **jax-finufft nufft1**: a 2-D type 1 NUFFT (points -> grid) is a sum over its points,",
      "  declared `signature=\"(T,j),(j),(j)->(T,m,k)\"`, `reduce={\"j\": \"sum\"}`, and a",
      "  `shard_attributes` rule `(attrs, batch, core) -> {n_tot: prod(batch), n_j: core[\"j\"]}`",
      "  so each device's call is told its own number of points. The all-reduce carries one",
      "  grid (`c128[1,1,m,m]`).",
      "- **grad**: `jax.grad(lambda f: sum(|nufft2(f, x, y)|^2))` with the points sharded. The",
      "  forward type 2 (grid -> points) is declared with the points as a batch dim behind a",
      "  `...` (`\"(t,T,m,k),(t,...),(t,...)->(t,T,...)\"`, rule `{n_j: prod(batch)}`): each",
      "  device evaluates its own points, no collective. Its transpose is a type 1 over the",
      "  same sharded points, the reduced call above: one all-reduce of the gradient grid.",
      "  shard_map by hand: `psum` of each device's gradient.",
      "- **column sum**: `out[j] = sum_i w[i] x[i, j]` through batchpart's test kernel; stock is",
      "  a plain `jax.ffi.ffi_call` of the same target. The kernel reads each element once, so",
      "  stock's cost is the all-gather of x plus 8 times the reads; batchpart's only",
      "  collective is one all-reduce of one result (`k` floats).",
      "",
      "Stock's gathers: under Shardy the gradient's stock program gathers the points once for",
      "both FINUFFT calls; under GSPMD once per call. batchpart's program has the one",
      "all-reduce under both.",
      "",
      "Each timed call blocks until its result is ready. `_timing.interleaved` dispatches a",
      "candidate's calls back to back; on this machine about 50 back-to-back dispatches of a",
      "fast 8-device program with an all-reduce hang XLA's CPU runtime (some devices never",
      "reach the all-reduce's rendezvous and XLA aborts after 40 s). This is jax's, not",
      "batchpart's: `jax.jit(jax.shard_map(lambda x: jax.lax.psum(x.sum(0), \"x\"), ...))` on a",
      "`(65536, 16)` float32 array does it too, with async dispatch on or off.",
      "",
      "FINUFFT options: every program pins `upsampfac=2.0`. FINUFFT's default (0) picks the",
      "upsampling factor from the density of points, so a device's 100k points could be",
      "transformed with another factor than all 800k; the sum of the parts is then within",
      "FINUFFT's eps (1e-6) of the whole but not equal to it up to rounding. Pinned, the",
      "8 per-device grids sum to the unsharded grid to about 1e-15.",
      "",
      "FINUFFT threads: the 8-device programs (stock, shard_map, batchpart) all call FINUFFT",
      "with `opts=Opts(nthreads=1)`, one function for stock and batchpart. The 8 simulated",
      "devices are 8 threads on 2 cores, all running their device's call at once; FINUFFT's",
      "default (every core per call) would start 16 OpenMP threads on 2 cores, which slows",
      "every variant (see [benchmarks-adopt](benchmarks-adopt.md), where stock at its default",
      "threads is shown beside one thread per call). The devices share the one-device",
      "program's 2 cores, so distributing cannot beat it by 8x here; the 8-device programs",
      "can still be faster than it where 8 single-threaded FINUFFT calls use both cores",
      "better than one call on 2 threads does.",
      "",
  ]
  from _timing import write_doc
  return write_doc(os.path.join(DOCS, "benchmarks-reductions.md"), lines)


def _uptime() -> str:
  import subprocess
  try:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
  except OSError:
    return "load average: " + ", ".join(f"{v:.2f}" for v in os.getloadavg())


def main() -> None:
  sys.path.insert(0, HERE)
  from _timing import parts_in_children
  before = _uptime()
  done = parts_in_children(__file__, PARTS, timeout=1200)
  if done is None:
    return
  rows, quick = done
  load = f"`{before}`; `{_uptime()}`"
  print(write(rows, quick, load))


if __name__ == "__main__":
  main()
