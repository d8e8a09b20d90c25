"""Host callbacks on a batch-sharded input, 8 simulated CPU devices,
interleaved in one process, under Shardy and GSPMD:

- ``bp.pure_callback``: each device calls NumPy on its own block;
- ``jax.pure_callback``: jax gathers the batch onto device 0, calls once on
  all of it, and scatters the result back;
- ``jax.shard_map`` around ``jax.pure_callback``: per block, by hand.

The callback is ``np.linalg.eigvalsh`` on ``(1024, 48, 48)`` float64. Also
reported: the bytes any one device receives through collectives in the
compiled program (the largest collective result on one device, summed over
the program's collectives).

Then a log-likelihood summed over sharded data (``reduce=``):
``scipy.stats.norm.logpdf(data, mu, sigma).sum()`` over ``(2**21, 4)`` float64
rows, through ``bp.pure_callback(..., signature="(n,k)->()",
reduce={"n": "sum"})`` (each device calls SciPy on its own rows, one
all-reduce of one scalar combines the sums), ``jax.pure_callback`` (every row
gathered onto device 0, one call) and ``jax.shard_map`` around
``jax.pure_callback`` by hand, its per-device sums added by a second program
(a ``jax.lax.psum`` or ``jnp.sum`` in the same program hangs on simulated CPU
devices: jax's callback ``device_put``s its operands onto device 0 while
device 0 waits in the collective, docs/callbacks.md).

Then a package's own ``jax.pure_callback`` (eigvalsh as above) made per shard
by ``bp.partition_callback`` (jax.Array operands, the default, and
``arrays="numpy"``), the package unchanged, against the same package
undeclared and against ``jax.shard_map`` by hand.

Then the call path's own cost, with tiny work (``np.sin`` on 64 and 1024
float32 rows): batchpart's host code per device call (``HostCall`` around a
function that returns its operand, ``arrays="numpy"`` and ``"jax"``), the
whole program against ``jax.pure_callback``'s one gathered call, and the
compile time of a program of 10 callbacks against 10 of jax's.

  python benchmarks/callbacks.py           # prints the markdown tables, writes
                                           # docs/benchmarks-callbacks.png (matplotlib)
  python benchmarks/callbacks.py --quick   # (256, 48, 48) and 2**18 rows, fewer repeats
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main(argv):
  quick = "--quick" in argv
  os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
  sys.path.insert(0, HERE)
  import jax
  jax.config.update("jax_enable_x64", True)
  jax.config.update("jax_cpu_enable_async_dispatch", False)
  sections = {"eigvalsh, 8 blocks": eigvalsh(quick)}
  print()
  sections["log-likelihood, reduce="] = log_likelihood(quick)
  print()
  sections["a package's callback"] = package_callback(quick)
  plot(sections)
  print()
  host_overhead()
  print()
  tiny_work(quick)
  print()
  compile_time(quick)


def _symmetric_batch(quick: bool):
  """The eigvalsh input both eigvalsh tables use: ``n, k``, the 8-device Auto
  mesh, ``(n, k, k)`` symmetric float64 matrices, them batch-sharded, and
  their eigenvalues."""
  import jax
  import numpy as np
  from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

  n, k = (256, 48) if quick else (1024, 48)
  mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))
  a = np.random.default_rng(0).standard_normal((n, k, k))
  x = a + np.swapaxes(a, -1, -2)
  return n, k, mesh, x, jax.device_put(x, NamedSharding(mesh, P("x"))), np.linalg.eigvalsh(x)


def eigvalsh(quick: bool) -> list:
  """The eigvalsh table."""
  import jax
  import numpy as np
  from _timing import print_comparison, under_both_partitioners
  from jax.sharding import PartitionSpec as P

  import batchpart as bp

  n, k, mesh, x, xs, want = _symmetric_batch(quick)
  out = jax.ShapeDtypeStruct((n, k), np.float64)
  local = jax.ShapeDtypeStruct((n // 8, k), np.float64)

  def ours(x):
    return bp.pure_callback(np.linalg.eigvalsh, out, x, num_batch_dims=1)

  def stock(x):
    return jax.pure_callback(np.linalg.eigvalsh, out, x)

  by_hand = jax.shard_map(
      lambda x: jax.pure_callback(np.linalg.eigvalsh, local, x),
      mesh=mesh, in_specs=P("x"), out_specs=P("x"))
  named = {"bp.pure_callback": ours, "jax.pure_callback": stock,
           "shard_map(jax.pure_callback)": by_hand}

  def candidates():
    return {name: (jax.jit(f),) * 2 for name, f in named.items()}

  check = lambda y: np.testing.assert_allclose(y, want, rtol=1e-8, atol=1e-8)
  rows = under_both_partitioners(candidates, (xs,), check, repeats=3 if quick else 11)
  print(f"eigvalsh on ({n}, {k}, {k}) float64, batch-sharded over 8 simulated CPU devices, "
        f"jax {jax.__version__}\n")
  print_comparison(rows, "bp.pure_callback", "callback")
  print(f"\noperand: {x.nbytes:,} bytes ({x.nbytes // 8:,} per device)")
  return rows


def log_likelihood(quick: bool) -> list:
  """The log-likelihood table: a sum over sharded rows (reduce=)."""
  import jax
  import numpy as np
  import scipy.stats
  from _timing import print_comparison, under_both_partitioners
  from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

  import batchpart as bp

  n = 2 ** 18 if quick else 2 ** 21
  mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))
  data = np.random.default_rng(0).normal(0.3, 1.7, size=(n, 4))
  ds = jax.device_put(data, NamedSharding(mesh, P("x")))
  want = scipy.stats.norm.logpdf(data, 0.25, 1.5).sum()
  scalar = jax.ShapeDtypeStruct((), np.float64)

  def loglik(d):
    return np.asarray(scipy.stats.norm.logpdf(d, 0.25, 1.5).sum(), np.float64)

  def ours(d):
    return bp.pure_callback(loglik, scalar, d, signature="(n,k)->()", reduce={"n": "sum"})

  def stock(d):
    return jax.pure_callback(loglik, scalar, d)

  partials = jax.shard_map(
      lambda d: jax.pure_callback(loglik, scalar, d)[None],
      mesh=mesh, in_specs=P("x"), out_specs=P("x"))
  add = jax.jit(lambda p: p.sum())

  def candidates():
    ours_jit, stock_jit, partials_jit = jax.jit(ours), jax.jit(stock), jax.jit(partials)
    return {"bp.pure_callback(reduce=)": (ours_jit, ours_jit),
            "jax.pure_callback": (stock_jit, stock_jit),
            "shard_map(jax.pure_callback), then a sum": (lambda d: add(partials_jit(d)),
                                                         partials_jit)}

  check = lambda y: np.testing.assert_allclose(float(y), want, rtol=1e-9)
  rows = under_both_partitioners(candidates, (ds,), check, repeats=3 if quick else 11)
  print(f"norm.logpdf summed over ({n}, 4) float64 rows, sharded over 8 simulated CPU "
        f"devices, jax {jax.__version__}\n")
  print_comparison(rows, "bp.pure_callback(reduce=)", "callback")
  return rows


def package_callback(quick: bool) -> list:
  """The partition_callback table: a package's jitted function calling
  ``jax.pure_callback`` itself. The undeclared package calls an identical
  copy of the declared function, so both run interleaved in one process."""
  import jax
  import numpy as np
  from _timing import print_comparison, under_both_partitioners
  from jax.sharding import PartitionSpec as P

  import batchpart as bp

  n, k, mesh, x, xs, want = _symmetric_batch(quick)

  def package(host_fn):
    """What a package writes: its callback inside its own jitted function."""
    return jax.jit(lambda x: jax.pure_callback(
        host_fn, jax.ShapeDtypeStruct(x.shape[:-1], x.dtype), x, vmap_method="expand_dims"))

  def eig_jax(x):
    return np.linalg.eigvalsh(x)

  def eig_numpy(x):
    return np.linalg.eigvalsh(x)

  def eig_stock(x):
    return np.linalg.eigvalsh(x)

  bp.partition_callback(eig_jax, num_batch_dims=1)
  bp.partition_callback(eig_numpy, num_batch_dims=1, arrays="numpy")
  by_hand = jax.jit(jax.shard_map(
      lambda x: jax.pure_callback(eig_stock, jax.ShapeDtypeStruct((n // 8, k), x.dtype), x),
      mesh=mesh, in_specs=P("x"), out_specs=P("x")))
  named = {"partition_callback": package(eig_jax),
           'partition_callback(arrays="numpy")': package(eig_numpy),
           "the package, stock": package(eig_stock),
           "shard_map(jax.pure_callback)": by_hand}

  def candidates():
    return {name: (f, f) for name, f in named.items()}

  check = lambda y: np.testing.assert_allclose(y, want, rtol=1e-8, atol=1e-8)
  try:
    rows = under_both_partitioners(candidates, (xs,), check, repeats=3 if quick else 11)
  finally:
    bp.unpartition(eig_jax)
    bp.unpartition(eig_numpy)
  print(f"a package's jax.pure_callback(eigvalsh) on ({n}, {k}, {k}) float64, batch-sharded "
        f"over 8 simulated CPU devices, jax {jax.__version__}\n")
  print_comparison(rows, "partition_callback", "callback")
  return rows


def plot(sections: dict) -> None:
  """docs/benchmarks-callbacks.png: each candidate's time over batchpart's
  (the first candidate of each section), Shardy and GSPMD side by side."""
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError:
    print("matplotlib missing: no plot (pip install -e '.[bench]')")
    return
  fig, axes = plt.subplots(len(sections), 1, figsize=(7, 2.1 * len(sections)))
  for ax, (title, rows) in zip(axes, sections.items()):
    names = list(dict.fromkeys(name for _, name, _, _ in rows))
    base = {p: t for p, name, t, _ in rows if name == names[0]}
    for k, partitioner in enumerate(("shardy", "gspmd")):
      ratio = {name: t / base[p] for p, name, t, _ in rows if p == partitioner}
      ax.barh([i + 0.4 * k for i in range(len(names))], [ratio[n] for n in names],
              height=0.4, label=partitioner)
    ax.set_yticks([i + 0.2 for i in range(len(names))], names, fontsize=8)
    ax.invert_yaxis()
    ax.axvline(1, color="k", lw=0.8)
    ax.set_title(title, fontsize=9)
  axes[0].legend(fontsize=8)
  axes[-1].set_xlabel("time over batchpart's (8 simulated CPU devices)")
  fig.tight_layout()
  fig.savefig(os.path.join(HERE, "..", "docs", "benchmarks-callbacks.png"), dpi=120)


def host_overhead() -> None:
  """batchpart's own host work per device call: ``HostCall`` around a
  function that returns its operand, on an even block and on the short last
  block of an uneven batch (trim and pad), for both ``arrays=``."""
  import functools
  import timeit

  import jax
  import numpy as np

  from batchpart._callback import host

  def call_of(batch, arrays):
    flat = host.FlatCallback(lambda x: x, jax.tree_util.tree_structure(((0,), {})),
                             jax.tree_util.tree_structure(0), with_index=False,
                             kind="pure_callback", arrays=arrays)
    return host.HostCall(flat, batch=(batch,), operand_shapes=[(batch,)],
                         operand_batch_ranks=(1,), result_shapes=[(batch,)],
                         result_dtypes=[np.float32], unit=False)

  print("batchpart's host code per device call (one float32 operand of 8 rows, a function "
        "returning it; best of 5)\n")
  print("| block | arrays | us per call |")
  print("| --- | --- | ---: |")
  for label, batch, block in (("even (rows 8:16 of 64)", 64, [8, 8]),
                              ("short last (row 12 of 13, 1 of 2 valid)", 13, [12, 2])):
    for arrays in ("numpy", "jax"):
      args = (np.array(block, np.int64), np.zeros(block[1], np.float32))
      n = 20000
      best = min(timeit.repeat(functools.partial(call_of(batch, arrays), *args), number=n,
                               repeat=5)) / n
      print(f"| {label} | {arrays} | {best * 1e6:.1f} |")


def tiny_work(quick: bool) -> None:
  """``np.sin`` on a few rows: the call path's cost against jax's one
  gathered call, each candidate blocking on its result."""
  import functools

  import jax
  import numpy as np
  from _timing import print_comparison, under_both_partitioners
  from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

  import batchpart as bp

  mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))
  for n in (64, 1024):
    x = np.linspace(0, 1, n, dtype=np.float32)
    out = jax.ShapeDtypeStruct((n,), np.float32)
    named = {
        "bp.pure_callback": functools.partial(bp.pure_callback, np.sin, out,
                                              num_batch_dims=1),
        'bp.pure_callback(arrays="jax")': functools.partial(
            bp.pure_callback, np.sin, out, num_batch_dims=1, arrays="jax"),
        "jax.pure_callback": functools.partial(jax.pure_callback, np.sin, out),
    }
    candidates = functools.partial(_blocking_candidates, named)
    check = functools.partial(np.testing.assert_allclose, desired=np.sin(x), rtol=1e-6)
    rows = under_both_partitioners(candidates, (jax.device_put(x, NamedSharding(mesh, P("x"))),),
                                   check, repeats=5 if quick else 11)
    print(f"np.sin on {n} float32 rows, batch-sharded over 8 simulated CPU devices\n")
    print_comparison(rows, "jax.pure_callback", "callback")
    print()


def _blocking_candidates(named: dict) -> dict:
  """``under_both_partitioners``' candidates: each jitted function, timed
  waiting on every result (jax's gathered callback, dispatched again before
  the last finished, can stall on simulated devices)."""
  import jax
  out = {}
  for name, f in named.items():
    jitted = jax.jit(f)
    out[name] = (lambda x, g=jitted: jax.block_until_ready(g(x)), jitted)
  return out


def compile_time(quick: bool) -> None:
  """Lowering and compiling a program of 10 chained callbacks (fresh
  functions each time, so nothing is cached), batchpart's against jax's,
  interleaved, under both partitioners."""
  import statistics
  import time

  import jax
  import numpy as np
  from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

  import batchpart as bp

  mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))
  xs = jax.device_put(np.linspace(0, 1, 64, dtype=np.float32), NamedSharding(mesh, P("x")))
  out = jax.ShapeDtypeStruct((64,), np.float32)
  calls = {"bp.pure_callback": lambda fn, x: bp.pure_callback(fn, out, x, num_batch_dims=1),
           "jax.pure_callback": lambda fn, x: jax.pure_callback(fn, out, x)}

  def seconds(call) -> float:
    def f(x):
      for i in range(10):
        x = call(lambda v, i=i: np.sin(v) + np.float32(i), x)
      return x
    start = time.perf_counter()
    jax.jit(f).lower(xs).compile()
    return time.perf_counter() - start

  print("lower + compile, a program of 10 chained callbacks on 8 devices (median)\n")
  print("| partitioner | callback | time | vs jax.pure_callback |")
  print("| --- | --- | ---: | ---: |")
  for partitioner in ("shardy", "gspmd"):
    jax.config.update("jax_use_shardy_partitioner", partitioner == "shardy")
    for call in calls.values():
      seconds(call)
    samples = {name: [] for name in calls}
    for _ in range(5 if quick else 15):
      for name, call in calls.items():
        samples[name].append(seconds(call))
    median = {name: statistics.median(v) for name, v in samples.items()}
    for name in calls:
      print(f"| {partitioner} | {name} | {median[name] * 1e3:.1f} ms | "
            f"{median[name] / median['jax.pure_callback']:.2f}x |")


if __name__ == "__main__":
  main(sys.argv[1:])
