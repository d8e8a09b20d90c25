"""Existing FFI primitives made batch partitionable, stock vs partitioned,
on 8 simulated CPU devices, interleaved in one process.

  python benchmarks/adopt.py            # records docs/benchmarks-adopt.json, see below
  python benchmarks/adopt.py --quick    # smaller shapes; prints the table, writes nothing

A full run records its rows in docs/benchmarks-adopt.json, rewrites the table between the
``<!-- results: ... -->`` markers of docs/benchmarks-adopt.md (the rest of the page is written
by hand: its prose quotes the recorded numbers, so reread it after a run) and redraws
docs/benchmarks-adopt-times.png with benchmarks/plot_adopt.py.

Each stock program is compiled before ``bp.partition_primitive`` wraps its
primitive (the wrap is process-wide; a compiled executable is not affected),
then the partitioned one; the two executables are timed side by side.

- jax-finufft ``nufft1`` / ``nufft2`` (1-D, complex64), batch-sharded: stock
  all-gathers the batch and every device runs every transform.
- a package calling ``jax.ffi.ffi_call`` directly inside ``custom_vmap``
  (jaxlib's Cholesky target), batch-sharded, through
  ``bp.partition_ffi_target``: stock all-gathers the batch.
- a kernel whose batch dims sit in the middle of its operands
  (``"(a,...,r),()->(p,...)"``), time-sharded, through
  ``bp.partition_ffi_target``: stock all-gathers.
- ``jnp.linalg`` cholesky / eigh / qr / svd on a matrix-dim-sharded input:
  stock replicates the batch (each device factors all of it). Run in a child
  process with a time limit: jaxlib's LAPACK kernels can deadlock XLA's CPU
  pool on 8 simulated devices (docs/reliability.md); a run that hangs is
  retried.
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DOCS = os.path.join(os.path.dirname(HERE), "docs")


def _setup():
  os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
  sys.path.insert(0, HERE)
  import jax
  from jax.sharding import AxisType
  return jax, jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))




def run_finufft(quick: bool) -> list[dict]:
  jax, mesh = _setup()
  import jax_finufft
  import numpy as np
  from _timing import interleaved
  from jax.sharding import NamedSharding, PartitionSpec as P
  from jax_finufft import ops

  import batchpart as bp

  def wrap():
    # Each shard's transform count, and one thread per shard: the simulated
    # devices already run the shards in parallel on the same cores (FINUFFT's
    # default, all cores per call, oversubscribes them 8 times).
    rule = lambda attrs, batch: {"n_tot": np.int64(np.prod(batch)),
                                 "nthreads": np.int64(1)}
    for p in (ops.nufft1_p, ops.nufft2_p, ops.nufft3_p):
      bp.partition_primitive(p, num_batch_dims=1, shard_attributes=rule)

  rows = []
  r = np.random.default_rng(0)
  batch, points, modes = (16, 20_000, 256) if quick else (64, 100_000, 1024)
  sharding = NamedSharding(mesh, P("x"))
  x = jax.device_put(r.uniform(-np.pi, np.pi, (batch, points)).astype(np.float32), sharding)
  c = jax.device_put((r.standard_normal((batch, points)) +
                      1j * r.standard_normal((batch, points))).astype(np.complex64), sharding)
  f = jax.device_put((r.standard_normal((batch, modes)) + 0j).astype(np.complex64), sharding)
  one_thread = jax_finufft.options.Opts(nthreads=1)
  # One call of each on one device first: jax-finufft's first call is not safe
  # on several devices at once (docs/reductions.md), stock or partitioned.
  host = [np.asarray(a)[:1] for a in (c, x, f)]
  jax.block_until_ready(jax_finufft.nufft1(modes, host[0], host[1]))
  jax.block_until_ready(jax_finufft.nufft2(host[2], host[1]))
  cases = {
      "nufft1": (lambda c, x, **kw: jax_finufft.nufft1(modes, c, x, **kw), (c, x)),
      "nufft2": (lambda f, x, **kw: jax_finufft.nufft2(f, x, **kw), (f, x)),
  }
  compile_ = lambda fn, args, **kw: jax.jit(lambda *a: fn(*a, **kw)).lower(*args).compile()
  stocks = {name: compile_(fn, args) for name, (fn, args) in cases.items()}
  stocks_1t = {name: compile_(fn, args, opts=one_thread) for name, (fn, args) in cases.items()}
  wrap()
  for name, (fn, args) in cases.items():
    partitioned = compile_(fn, args)
    want = np.asarray(stocks[name](*args))
    np.testing.assert_allclose(np.asarray(partitioned(*args)), want, rtol=1e-4,
                               atol=1e-4 * np.abs(want).max())
    t = interleaved({"stock": stocks[name], "stock_1t": stocks_1t[name],
                     "batchpart": partitioned}, args, repeats=3 if quick else 7)
    rows.append({"key": name, "op": f"jax-finufft {name}", "shape": f"{batch} x {points} points, "
                 f"{modes} modes", "sharding": 'P("x")', "stock_s": t["stock"],
                 "stock_1t_s": t["stock_1t"], "batchpart_s": t["batchpart"]})
    print(rows[-1], flush=True)
  return rows


def run_linalg(quick: bool) -> list[dict]:
  jax, mesh = _setup()
  jax.config.update("jax_cpu_enable_async_dispatch", False)
  import jax.numpy as jnp
  import numpy as np
  from _timing import interleaved
  from jax.sharding import NamedSharding, PartitionSpec as P

  import batchpart as bp

  L = jax.lax.linalg
  batch, n = (256, 32) if quick else (512, 64)
  m = np.random.default_rng(1).standard_normal((batch, n, n)).astype(np.float32)
  a = jax.device_put(m @ np.swapaxes(m, -1, -2) + n * np.eye(n, dtype=np.float32),
                     NamedSharding(mesh, P(None, "x")))
  cases = {
      "cholesky": jnp.linalg.cholesky,
      "eigh": lambda a: jnp.linalg.eigh(a)[0],
      "qr": lambda a: jnp.linalg.qr(a)[1],
      "svd": lambda a: jnp.linalg.svd(a, compute_uv=False),
  }
  stocks = {name: jax.jit(fn).lower(a).compile() for name, fn in cases.items()}
  nbd = lambda operand_shapes, result_shapes: len(operand_shapes[0]) - 2
  for p in (L.cholesky_p, L.eigh_p, L.qr_p, L.svd_p):
    bp.partition_primitive(p, num_batch_dims=nbd)
  rows = []
  for name, fn in cases.items():
    partitioned = jax.jit(fn).lower(a).compile()
    np.testing.assert_allclose(np.asarray(partitioned(a)), np.asarray(stocks[name](a)),
                               rtol=1e-3, atol=1e-3)
    t = interleaved({"stock": stocks[name], "batchpart": partitioned}, (a,),
                    repeats=3 if quick else 7)
    rows.append({"key": name, "op": f"jnp.linalg.{name}", "shape": f"{batch} x {n} x {n}",
                 "sharding": 'P(None, "x")', "stock_s": t["stock"],
                 "batchpart_s": t["batchpart"]})
    print(rows[-1], flush=True)
  return rows


def run_ffi_target(quick: bool) -> list[dict]:
  """A package that calls jax.ffi.ffi_call directly (here jaxlib's own
  LAPACK Cholesky target, inside jax.custom_batching.custom_vmap as real
  packages do), batch-sharded: stock gathers the batch onto every device;
  ``bp.partition_ffi_target`` keeps it local."""
  jax, mesh = _setup()
  jax.config.update("jax_cpu_enable_async_dispatch", False)
  import numpy as np
  from _timing import interleaved
  from jax.sharding import NamedSharding, PartitionSpec as P

  import batchpart as bp

  target = "lapack_spotrf_ffi"
  jax.numpy.linalg.cholesky(np.eye(2, dtype=np.float32))   # jaxlib registers its targets

  def potrf(a):
    b = len(a.shape) - 2
    col_major = (*range(b), b + 1, b)   # major-to-minor: LAPACK's column-major matrices
    l, _ = jax.ffi.ffi_call(
        target, (jax.ShapeDtypeStruct(a.shape, a.dtype),
                 jax.ShapeDtypeStruct(a.shape[:-2], np.int32)),
        input_layouts=[col_major], output_layouts=[col_major, None],
        input_output_aliases={0: 0})(a, uplo=np.uint8(ord("L")))
    return l

  @jax.custom_batching.custom_vmap
  def package_cholesky(a):
    return potrf(a)

  @package_cholesky.def_vmap
  def _(axis_size, in_batched, a):
    return potrf(a), True

  batch, n = (256, 32) if quick else (512, 64)
  m = np.random.default_rng(2).standard_normal((batch, n, n)).astype(np.float32)
  a = jax.device_put(m @ np.swapaxes(m, -1, -2) + n * np.eye(n, dtype=np.float32),
                     NamedSharding(mesh, P("x")))
  fn = jax.vmap(package_cholesky)
  stock = jax.jit(fn).lower(a).compile()
  bp.partition_ffi_target(target, signature="(n,n)->(n,n),()")
  partitioned = jax.jit(fn).lower(a).compile()
  np.testing.assert_allclose(np.tril(np.asarray(partitioned(a))),
                             np.tril(np.asarray(stock(a))), rtol=1e-4, atol=1e-4)
  t = interleaved({"stock": stock, "batchpart": partitioned}, (a,),
                  repeats=3 if quick else 7)
  row = {"key": "ffi_target", "op": "a package's own `jax.ffi.ffi_call` of LAPACK's Cholesky "
         "in `custom_vmap` (`partition_ffi_target`)", "shape": f"{batch} x {n} x {n}",
         "sharding": 'P("x")', "stock_s": t["stock"], "batchpart_s": t["batchpart"]}
  print(row, flush=True)
  return [row]


def run_anywhere(quick: bool) -> list[dict]:
  """A kernel whose batch dims are not leading, called by a package through
  ``jax.ffi.ffi_call``: operands (antenna, freq, time, r), result
  (baseline, freq, time), time-sharded. Stock gathers the whole input onto
  every device; declared with ``"(a,...,r)->(p,...)"`` each device runs its
  own time slice. The kernel (``batchpart_test_core_sum``) reads every input
  element once: the gather, not the arithmetic, is what stock pays for."""
  jax, mesh = _setup()
  jax.config.update("jax_cpu_enable_async_dispatch", False)
  import numpy as np
  from _timing import interleaved
  from jax.sharding import NamedSharding, PartitionSpec as P

  import batchpart as bp
  from batchpart import testing

  testing.register()
  target = "batchpart_test_core_sum"
  antennas, freqs, times, r = (8, 16, 256, 16) if quick else (8, 64, 512, 32)
  baselines = antennas * (antennas - 1) // 2
  attrs = {k: np.int64(v) for k, v in dict(x_lead=1, x_trail=1, y_lead=0, y_trail=0,
                                           out_lead=1, out_trail=0).items()}
  w = np.zeros((), np.float32)

  def package_visibilities(x):
    out = jax.ShapeDtypeStruct((baselines, *x.shape[1:3]), x.dtype)
    return jax.ffi.ffi_call(target, out)(x, w, **attrs)

  x = jax.device_put(
      np.random.default_rng(3).standard_normal((antennas, freqs, times, r)).astype(np.float32),
      NamedSharding(mesh, P(None, None, "x")))
  stock = jax.jit(package_visibilities).lower(x).compile()
  bp.partition_ffi_target(target, signature="(a,...,r),()->(p,...)")
  partitioned = jax.jit(package_visibilities).lower(x).compile()
  np.testing.assert_allclose(np.asarray(partitioned(x)), np.asarray(stock(x)), rtol=1e-4,
                             atol=1e-3)
  t = interleaved({"stock": stock, "batchpart": partitioned}, (x,),
                  repeats=3 if quick else 7)
  row = {"key": "anywhere",
         "op": "batch dims in the middle, `(a,...,r)->(p,...)` (`partition_ffi_target`)",
         "shape": f"{antennas} x {freqs} x {times} x {r}", "sharding": 'P(None, None, "x")',
         "stock_s": t["stock"], "batchpart_s": t["batchpart"]}
  print(row, flush=True)
  return [row]


def table(rows) -> list[str]:
  """The page's results table."""
  lines = [
      "| op | shape | input sharding | stock | stock, 1 thread/call | batchpart | "
      "stock / batchpart |",
      "| --- | --- | --- | --- | --- | --- | --- |",
  ]
  for r in rows:
    one = f"{r['stock_1t_s'] * 1e3:.2f} ms" if "stock_1t_s" in r else "-"
    lines.append(f"| {r['op']} | {r['shape']} | `{r['sharding']}` | "
                 f"{r['stock_s'] * 1e3:.2f} ms | {one} | {r['batchpart_s'] * 1e3:.2f} ms | "
                 f"{r['stock_s'] / r['batchpart_s']:.2f}x |")
  return lines


def write(rows) -> None:
  """Records the rows in docs/benchmarks-adopt.json, rewrites the page's table between its
  markers and redraws the chart."""
  import _pages

  _pages.write_json(os.path.join(DOCS, "benchmarks-adopt.json"), {"rows": rows})
  _pages.update_page(os.path.join(DOCS, "benchmarks-adopt.md"), {"results": table(rows)})
  _pages.draw("plot_adopt")


def main() -> None:
  sys.path.insert(0, HERE)
  from _timing import parts_in_children
  # In the page's order (the table's rows).
  done = parts_in_children(__file__, {"finufft": run_finufft, "ffi_target": run_ffi_target,
                                      "anywhere": run_anywhere, "linalg": run_linalg},
                           timeout=1200)
  if done is not None:
    rows, quick = done
    print("\n".join(table(rows)))
    if not quick:
      write(rows)


if __name__ == "__main__":
  main()
