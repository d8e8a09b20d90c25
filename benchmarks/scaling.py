"""Scaling of one batch-partitionable FFI call over 1, 2, 4 and 8 simulated
CPU devices, five ways, measured side by side in one process.

  python benchmarks/scaling.py            # records docs/benchmarks-scaling.json, see below
  python benchmarks/scaling.py --quick     # smaller shapes; prints the tables, writes nothing

A full run records its measurements in docs/benchmarks-scaling.json, rewrites the two tables
between the ``<!-- results: ... -->`` and ``<!-- compile: ... -->`` markers of
docs/benchmarks-scaling.md (the rest of the page is written by hand: its prose quotes the
recorded numbers, so reread it after a run) and redraws docs/benchmarks-scaling-times.png with
benchmarks/plot_scaling.py.

The work is held fixed (a row-wise softmax over a batch-sharded input of
``--rows x --cols`` float32) while the device count grows. Candidates:

- batchpart: ``batchpart.ffi_call`` on a target batchpart marked;
- plain ffi_call: ``jax.ffi.ffi_call`` (XLA gathers, every device runs all rows);
- built-in: the same ``batchpart.ffi_call`` lowering (it carries the
  ``num_batch_dims`` frontend attribute and a Shardy rule) on a target marked
  with jax's ``register_ffi_target_as_batch_partitionable``, i.e. XLA's own
  batch partitioner;
- shard_map wrapper: ``jax.shard_map`` around the plain call;
- custom_partitioning: ``jax.experimental.custom_partitioning`` around it.

Also measured: collective bytes per call, compile time of a program with 50
call sites, and whether a second process hits the persistent compilation
cache for that program.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
DOCS = os.path.join(os.path.dirname(HERE), "docs")
MAX_DEVICES = 8
CANDIDATES = ["batchpart", "plain ffi_call", "built-in", "shard_map wrapper",
              "custom_partitioning"]
# Targets: one handler (the softmax test kernel) under one name per mechanism.
TARGETS = {"batchpart": "batchpart_test_softmax", "plain ffi_call": "scaling_plain_softmax",
           "built-in": "scaling_builtin_softmax"}


def _setup_jax():
  import jax
  jax.config.update("jax_num_cpu_devices", MAX_DEVICES)
  jax.config.update("jax_cpu_enable_async_dispatch", False)
  return jax


def _register():
  import jax

  import batchpart.testing
  from batchpart import _core

  batchpart.testing.register()
  capsule = _core.testing.handlers()["softmax"]
  jax.ffi.register_ffi_target(TARGETS["plain ffi_call"], capsule)
  jax.ffi.register_ffi_target(TARGETS["built-in"], capsule)
  jax.ffi.register_ffi_target_as_batch_partitionable(TARGETS["built-in"])


def _functions(mesh):
  """name -> softmax(x) returning the normalised rows."""
  import jax
  from jax.experimental.custom_partitioning import custom_partitioning
  from jax.sharding import NamedSharding, PartitionSpec as P

  import batchpart as bp

  def results(x):
    return (jax.ShapeDtypeStruct(x.shape, x.dtype), jax.ShapeDtypeStruct(x.shape[:-1], x.dtype))

  def plain(x):
    return jax.ffi.ffi_call(TARGETS["plain ffi_call"], results(x))(x)[0]

  def through_batchpart(target):
    return lambda x: bp.ffi_call(target, results(x), signature="(n)->(n),()")(x)[0]

  @custom_partitioning
  def cp_softmax(x):
    return plain(x)

  def cp_partition(mesh, arg_shapes, result_shape):
    spec = arg_shapes[0].sharding.spec
    batch = NamedSharding(mesh, P(spec[0] if len(spec) else None, None))
    return mesh, plain, batch, (batch,)

  def cp_infer(mesh, arg_shapes, result_shape):
    spec = arg_shapes[0].sharding.spec
    return NamedSharding(mesh, P(spec[0] if len(spec) else None, None))

  cp_softmax.def_partition(partition=cp_partition,
                           infer_sharding_from_operands=cp_infer,
                           sharding_rule="i j -> i j")
  return {
      "batchpart": through_batchpart(TARGETS["batchpart"]),
      "plain ffi_call": plain,
      "built-in": through_batchpart(TARGETS["built-in"]),
      "shard_map wrapper": jax.shard_map(plain, mesh=mesh, in_specs=P(mesh.axis_names[0]),
                                         out_specs=P(mesh.axis_names[0])),
      "custom_partitioning": cp_softmax,
  }


def _collective_bytes(f, x) -> int:
  import jax

  from batchpart import _hlo
  text = jax.jit(f).lower(x).compile().as_text()
  return sum(t.nbytes for c in _hlo.collectives(text) for t in c.result_types)


def measure_scaling(rows: int, cols: int, repeats: int) -> dict:
  import jax
  import numpy as np
  from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

  sys.path.insert(0, HERE)
  from _timing import interleaved

  import batchpart.testing as kernels

  x = np.random.default_rng(0).standard_normal((rows, cols), dtype=np.float32)
  reference = kernels.softmax_reference(x)[0]
  out = {"devices": [], "times": {c: [] for c in CANDIDATES},
         "collective_bytes": {c: [] for c in CANDIDATES}}
  for n in (1, 2, 4, 8):
    mesh = jax.make_mesh((n,), ("x",), axis_types=(AxisType.Auto,),
                         devices=jax.devices()[:n])
    xs = jax.device_put(x, NamedSharding(mesh, P("x")))
    fns = {name: jax.jit(f) for name, f in _functions(mesh).items()}
    for name, f in fns.items():
      np.testing.assert_allclose(f(xs), reference, rtol=1e-5, atol=1e-6)
      out["collective_bytes"][name].append(_collective_bytes(f, xs))
    print(f"  {n} device(s): timing {len(fns)} candidates interleaved ...", flush=True)
    times = interleaved(fns, (xs,), repeats=repeats)
    out["devices"].append(n)
    for name in CANDIDATES:
      out["times"][name].append(times[name])
  return out


COMPILE_SCRIPT = r"""
import json, os, sys, time
sys.path.insert(0, {here!r})
import scaling
jax = scaling._setup_jax()
jax.config.update("jax_compilation_cache_dir", {cache!r})
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
scaling._register()
mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))
f = scaling._functions(mesh)[{name!r}]
def program(x):
  # {sites} call sites on different slices of the input
  return [f(x[:, i:i + 8]) for i in range({sites})]
x = jax.device_put(np.ones((256, 8 + {sites}), np.float32), NamedSharding(mesh, P("x")))
lowered = jax.jit(program).lower(x)
t0 = time.perf_counter()
lowered.compile()
elapsed = time.perf_counter() - t0
entries = sum(len(files) for _, _, files in os.walk({cache!r}))
print(json.dumps({{"compile_s": elapsed, "cache_entries": entries}}))
"""


def measure_compile(sites: int) -> dict:
  """Compile time of a `sites`-call-site program per candidate, in a fresh
  process with an empty persistent cache, then again in a second process."""
  out = {}
  for name in CANDIDATES:
    with tempfile.TemporaryDirectory() as cache:
      script = COMPILE_SCRIPT.format(here=HERE, cache=cache, name=name, sites=sites)
      runs = []
      for _ in range(2):
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                              timeout=600)
        if proc.returncode != 0:
          raise RuntimeError(f"{name}: {proc.stderr[-2000:]}")
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    first, second = runs
    out[name] = {"first_s": first["compile_s"], "second_s": second["compile_s"],
                 "entries_after_first": first["cache_entries"],
                 "entries_after_second": second["cache_entries"],
                 # A hit adds no entry and skips XLA's compile.
                 "cache_hit": second["cache_entries"] == first["cache_entries"]
                              and second["compile_s"] < 0.5 * first["compile_s"]}
    print(f"  {name}: compile {first['compile_s']:.2f}s, second process "
          f"{second['compile_s']:.2f}s, cache hit: {out[name]['cache_hit']}", flush=True)
  return out


def _tables(scaling: dict, compile_times: dict, sites: int) -> dict[str, list[str]]:
  """The page's measured blocks, by marker name: the times table with the collective bytes,
  and the compile-time table."""
  sys.path.insert(0, HERE)
  from _timing import fmt_time

  results = [
      "| devices | " + " | ".join(CANDIDATES) + " |",
      "| ---: |" + " ---: |" * len(CANDIDATES)]
  for i, n in enumerate(scaling["devices"]):
    base = scaling["times"]["batchpart"][i]
    cells = [f"{fmt_time(scaling['times'][c][i]).strip()} ({scaling['times'][c][i] / base:.2f}x)"
             for c in CANDIDATES]
    results.append(f"| {n} | " + " | ".join(cells) + " |")
  results += ["", "Collective bytes per device per call (8 devices): " + ", ".join(
      f"{c} {scaling['collective_bytes'][c][-1]}" for c in CANDIDATES) + "."]
  compile_ = [
      "| candidate | compile (fresh process) | vs built-in | second process | cache hit |",
      "| --- | ---: | ---: | ---: | --- |"]
  builtin = compile_times["built-in"]["first_s"]
  for c in CANDIDATES:
    r = compile_times[c]
    compile_.append(f"| {c} | {r['first_s']:.2f}s ({r['first_s'] / sites * 1e3:.1f}ms/site) | "
                    f"{r['first_s'] / builtin:.2f}x | {r['second_s']:.3f}s | "
                    f"{'yes' if r['cache_hit'] else 'no'} |")
  return {"results": results, "compile": compile_}


def write(scaling: dict, compile_times: dict, setup: dict) -> None:
  """Records the run in docs/benchmarks-scaling.json, rewrites the page's tables between
  their markers and redraws the chart."""
  sys.path.insert(0, HERE)
  import _pages

  _pages.write_json(os.path.join(DOCS, "benchmarks-scaling.json"),
                    {"setup": setup, "scaling": scaling, "compile": compile_times})
  _pages.update_page(os.path.join(DOCS, "benchmarks-scaling.md"),
                     _tables(scaling, compile_times, setup["sites"]))
  _pages.draw("plot_scaling")


def main(argv=None) -> int:
  parser = argparse.ArgumentParser()
  parser.add_argument("--quick", action="store_true")
  parser.add_argument("--rows", type=int, default=16384)
  parser.add_argument("--cols", type=int, default=512)
  parser.add_argument("--sites", type=int, default=50)
  parser.add_argument("--no-write", action="store_true")
  args = parser.parse_args(argv)
  if args.quick:
    args.rows, args.cols, args.sites = 4096, 256, 10
  jax = _setup_jax()
  _register()
  print("Scaling (fixed work, 1-8 devices):", flush=True)
  repeats = 3 if args.quick else 7
  scaling = measure_scaling(args.rows, args.cols, repeats=repeats)
  print("Compile time and persistent cache:", flush=True)
  compile_times = measure_compile(args.sites)
  setup = {"jax": jax.__version__, "cores": os.cpu_count(), "rows": args.rows,
           "cols": args.cols, "sites": args.sites, "repeats": repeats}
  print()
  for block in _tables(scaling, compile_times, args.sites).values():
    print("\n".join(block), end="\n\n")
  if not (args.quick or args.no_write):
    write(scaling, compile_times, setup)
  return 0


if __name__ == "__main__":
  sys.exit(main())
