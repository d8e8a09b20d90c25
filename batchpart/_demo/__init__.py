"""``python -m batchpart demo``: batched Cholesky on simulated CPU devices,
through batchpart and through the plain alternatives, side by side.

For each input sharding (batch dim, core dim) and each way of calling the
same LAPACK Cholesky, it prints what ``bp.explain`` reads off the compiled
program (per-device operand shape, collectives, devices per batch element)
and the time per call measured interleaved with the others.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from typing import Any

from batchpart._explain.render import _bytes

_PLAIN_TARGET = "batchpart_demo_plain_potrf"
# jaxlib's own LAPACK kernels can deadlock XLA's CPU thread pool on simulated
# devices (the reliability page, "Hangs on simulated devices"), so the
# jnp.linalg baseline runs in a child process with a time limit: a hang there
# costs the demo one row, never the user's terminal.
_STOCK_TIMEOUT_S = 120
# XLA's C++ log lines ("W1128 07:55:43.08 ... sharding_propagation.cc] ...").
_XLA_LOG_LINE = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d")
_SPECS = {"batch-sharded": (0,), "core-sharded": (1,)}


def _configure(num_devices: int) -> None:
  import jax
  jax.config.update("jax_num_cpu_devices", num_devices)
  # XLA's CPU runtime can hang when programs mixing collectives and FFI calls
  # run many times with async dispatch on simulated devices (docs/faq.md).
  jax.config.update("jax_cpu_enable_async_dispatch", False)


def _candidates(mesh):
  """name -> cholesky(a) for a batch of SPD matrices."""
  import jax
  import jax.numpy as jnp
  from jax.sharding import PartitionSpec as P

  import batchpart as bp
  from batchpart import _core

  bp.linalg.cholesky(jnp.eye(2))  # registers the LAPACK targets
  jax.ffi.register_ffi_target(_PLAIN_TARGET, _core.lapack.handlers()["batchpart_potrf"])

  def plain_ffi_call(a):
    # The same kernel through jax.ffi.ffi_call, under a name batchpart never
    # marks, called as bp.linalg.cholesky calls it: row-major, upper. A symmetric
    # matrix read column-major is itself, and its upper factor read back row-major
    # is the lower one; asking XLA for column-major layouts instead would add a
    # transposing copy on each side of the kernel, work batchpart's call never does.
    factor, _ = jax.ffi.ffi_call(
        _PLAIN_TARGET,
        (jax.ShapeDtypeStruct(a.shape, a.dtype), jax.ShapeDtypeStruct(a.shape[:-2], "int32")),
        vmap_method="expand_dims")(a, lower=False, symmetrize=False)
    return factor

  shard_map_wrapper = jax.shard_map(
      plain_ffi_call, mesh=mesh, in_specs=P("x"), out_specs=P("x"))
  return {
      "batchpart.linalg": bp.linalg.cholesky,
      "jax.ffi.ffi_call": plain_ffi_call,
      "shard_map wrapper": shard_map_wrapper,
  }


@contextlib.contextmanager
def _without_xla_logs():
  """Runs the block with XLA's C++ log lines (written to file descriptor 2,
  e.g. its rematerialization warnings on the stock baselines, which read like
  batchpart's errors) held back; every other line of stderr is passed on."""
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile(mode="w+b") as held:
    os.dup2(held.fileno(), 2)
    try:
      yield
    finally:
      sys.stderr.flush()
      os.dup2(saved, 2)
      os.close(saved)
      held.seek(0)
      for line in held.read().decode(errors="replace").splitlines(keepends=True):
        if not _XLA_LOG_LINE.match(line) and line.strip():
          sys.stderr.write(line)
      sys.stderr.flush()


def _spec(label: str):
  """The PartitionSpec of a demo input sharding: axis 'x' on the dim ``_SPECS`` names."""
  from jax.sharding import PartitionSpec as P
  (dim,) = _SPECS[label]
  return P(*([None] * dim), "x")


def _spd_batch(batch: int, n: int):
  """The demo's input: ``batch`` well-conditioned SPD matrices, float32, and their factors."""
  import numpy as np
  rng = np.random.default_rng(0)
  x = rng.standard_normal((batch, n, n), dtype=np.float32)
  a = x @ np.swapaxes(x, -1, -2) / n + np.eye(n, dtype=np.float32)
  return a, np.linalg.cholesky(a)


def stock_child(label: str, num_devices: int, repeats: int, batch: int, n: int) -> None:
  """In a child process: jnp.linalg's row for ``label`` as one JSON line
  (per-device operand, collectives, devices per element, its time and
  batchpart's, measured interleaved here)."""
  _configure(num_devices)
  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

  import batchpart as bp

  mesh = jax.make_mesh((num_devices,), ("x",), axis_types=(AxisType.Auto,))
  a, reference = _spd_batch(batch, n)
  a_sharded = jax.device_put(a, NamedSharding(mesh, _spec(label)))
  fns = {name: jax.jit(f, out_shardings=NamedSharding(mesh, P("x"))) for name, f in
         (("jnp.linalg", jnp.linalg.cholesky), ("batchpart.linalg", bp.linalg.cholesky))}
  row = _summary(bp.explain(fns["jnp.linalg"], a_sharded))
  for f in fns.values():
    np.testing.assert_allclose(f(a_sharded), reference, rtol=1e-3, atol=1e-3)
  times = _interleaved(fns, a_sharded, repeats)
  print(json.dumps([*row, times["jnp.linalg"], times["jnp.linalg"] / times["batchpart.linalg"]]))


def _stock_row(label: str, num_devices: int, repeats: int, batch: int, n: int):
  """jnp.linalg's row from ``stock_child`` in a child process, or the reason
  there is none."""
  return _child_json(f"from batchpart import _demo; _demo.stock_child({label!r}, "
                     f"{num_devices}, {repeats}, {batch}, {n})", _STOCK_TIMEOUT_S)


def _child_json(code: str, timeout: float):
  """The last line ``python -c code`` prints, as JSON; or a sentence saying why
  there is none (it did not finish within ``timeout`` seconds, or failed)."""
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  try:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=timeout, env=env)
  except subprocess.TimeoutExpired:
    return (f"no result: stopped after {timeout:g} s (jaxlib's LAPACK kernels can "
            "deadlock XLA's CPU pool on simulated devices)")
  if done.returncode != 0:
    last = (done.stderr.strip().splitlines() or ["?"])[-1]
    return f"no result: the child process failed ({last[:80]})"
  return json.loads(done.stdout.strip().splitlines()[-1])


def _summary(report) -> tuple[str, str, str]:
  call = report.calls[0]
  shape = "x".join(map(str, (call.device_operand_shapes or ((),))[0]))
  kinds: dict[str, int] = {}
  for c in (*call.collectives_before, *call.collectives_after):
    kinds[c.kind] = kinds.get(c.kind, 0) + c.bytes
  collectives = ", ".join(f"{k} {_bytes(v)}" for k, v in sorted(kinds.items()))
  replication = "-" if call.replication is None else str(call.replication)
  return shape, collectives or "none", replication


def _table(fns: dict, args, operand: str, index: int, times: dict) -> None:
  """One row per call, under a header: what ``bp.explain`` reads off its
  program (the per-device shape of operand ``index``, collectives, devices per
  element) and its time over the first call's."""
  import batchpart as bp
  print(f"  {'call':<19} {'per-device ' + operand:<19} {'collectives':<34} "
        f"{'devices/element':>15} {'time':>9} {'vs batchpart':>12}")
  first = next(iter(fns))
  for name, f in fns.items():
    report = bp.explain(f, *args)
    _, collectives, replication = _summary(report)
    shapes = report.calls[0].device_operand_shapes or ()
    shape = "x".join(map(str, shapes[index])) if index < len(shapes) else "?"
    _print_row(name, shape, collectives, replication, times[name],
               times[name] / times[first])


def _interleaved(fns: dict, a, rounds: int) -> dict:
  return _interleaved_args(fns, (a,), rounds)


def _callbacks(mesh, a, repeats: int) -> None:
  """The same factorization as a Python host callback (NumPy), through
  bp.pure_callback and jax.pure_callback: where each runs and how long."""
  import threading

  import jax
  import numpy as np
  from jax.sharding import NamedSharding, PartitionSpec as P

  import batchpart as bp
  from batchpart import _hlo

  out = jax.ShapeDtypeStruct(a.shape, a.dtype)
  blocks, lock = [], threading.Lock()

  def numpy_cholesky(x, index=None):
    if index is not None:
      with lock:
        blocks.append((index[0].start, index[0].stop))
    return np.linalg.cholesky(x)

  fns = {
      "bp.pure_callback": jax.jit(lambda x: bp.pure_callback(
          numpy_cholesky, out, x, num_batch_dims=1, with_index=True)),
      "jax.pure_callback": jax.jit(lambda x: jax.pure_callback(numpy_cholesky, out, x)),
  }
  a_sharded = jax.device_put(a, NamedSharding(mesh, P("x")))
  print("host callback (np.linalg.cholesky), batch-sharded input:")
  for f in fns.values():
    np.testing.assert_allclose(f(a_sharded), np.linalg.cholesky(a), rtol=1e-3, atol=1e-3)
  times = _interleaved(fns, a_sharded, repeats)
  for name, f in fns.items():
    text = f.lower(a_sharded).compile().as_text() or ""
    moved = sum(t.nbytes for c in _hlo.collectives(text) for t in c.result_types)
    print(f"  {name:<19} collectives {_bytes(moved):>10} per device "
          f"{times[name] * 1e3:9.2f}ms")
  calls = sorted(set(blocks))
  print(f"  bp.pure_callback called NumPy {len(calls)} times per run, on rows "
        f"{', '.join(f'{b}:{e}' for b, e in calls[:3])}, ... (each device its own rows;\n"
        "  jax.pure_callback gathers all rows onto device 0 and calls once). The docs' page\n"
        "  'Host callbacks' says more.")


def _buffer_callbacks(mesh, a, repeats: int) -> None:
  """The same factorization written in place by a buffer callback, through
  bp.buffer_callback and jax.experimental.buffer_callback: how many calls,
  on how many rows, and how long."""
  import threading

  import jax
  import numpy as np
  from jax.experimental import buffer_callback as jax_buffer_callback
  from jax.sharding import NamedSharding, PartitionSpec as P

  import batchpart as bp
  from batchpart import _hlo

  out = jax.ShapeDtypeStruct(a.shape, a.dtype)
  rows: dict[Any, Any] = {}
  lock = threading.Lock()

  def cholesky_in_place(name):
    def write(ctx, factor, x):
      with lock:
        rows.setdefault(name, []).append(x.shape[0])
      np.asarray(factor)[...] = np.linalg.cholesky(np.asarray(x))
    return write

  fns = {
      "bp.buffer_callback": jax.jit(bp.buffer_callback(
          cholesky_in_place("bp.buffer_callback"), out, num_batch_dims=1)),
      "jax buffer_callback": jax.jit(jax_buffer_callback.buffer_callback(
          cholesky_in_place("jax buffer_callback"), out)),
  }
  a_sharded = jax.device_put(a, NamedSharding(mesh, P("x")))
  print("buffer callback (np.linalg.cholesky written into the result buffer), "
        "batch-sharded input:")
  for f in fns.values():
    np.testing.assert_allclose(f(a_sharded), np.linalg.cholesky(a), rtol=1e-3, atol=1e-3)
  rows.clear()
  times = _interleaved(fns, a_sharded, repeats)
  for name, f in fns.items():
    text = f.lower(a_sharded).compile().as_text() or ""
    moved = sum(t.nbytes for c in _hlo.collectives(text) for t in c.result_types)
    per_run = len(rows[name]) // repeats
    print(f"  {name:<19} collectives {_bytes(moved):>10} per device "
          f"{times[name] * 1e3:9.2f}ms  {per_run} calls per run of "
          f"{max(rows[name])} rows each")
  print("  jax's buffer_callback gathers the batch onto every device and each runs it all;\n"
        "  batchpart's calls each device once, in place, on its own rows.")


def _reductions(mesh, num_devices: int, repeats: int) -> None:
  """A call that sums over a sharded dim (reduce=): a weighted column sum
  through an FFI kernel, and a log-likelihood through a host callback, each
  against jax's own call and a shard_map + psum by hand."""
  import jax
  import numpy as np
  from jax.sharding import NamedSharding, PartitionSpec as P

  import batchpart as bp
  from batchpart import _core, testing

  testing.register()
  plain = "batchpart_demo_plain_reduce_rows"
  jax.ffi.register_ffi_target(plain, _core.testing.handlers()["reduce_rows"])
  rng = np.random.default_rng(1)
  n, k = 64 * 1024, 64
  x = rng.standard_normal((n, k), dtype=np.float32)
  w = rng.standard_normal((n,), dtype=np.float32)
  out = jax.ShapeDtypeStruct((k,), np.float32)
  attrs = {"op": np.int64(0), "rows": np.int64(-1)}
  plain_call = lambda x, w: jax.ffi.ffi_call(plain, out)(x, w, **attrs)
  fns = {
      "bp.ffi_call": jax.jit(lambda x, w: testing.reduce_rows(x, w)),
      "jax.ffi.ffi_call": jax.jit(plain_call),
      "shard_map + psum": jax.jit(jax.shard_map(
          lambda x, w: jax.lax.psum(plain_call(x, w), "x"), mesh=mesh,
          in_specs=(P("x"), P("x")), out_specs=P())),
  }
  args = (jax.device_put(x, NamedSharding(mesh, P("x"))),
          jax.device_put(w, NamedSharding(mesh, P("x"))))
  want = (w[:, None] * x).sum(0)
  print(f"reduction: a weighted column sum over {n} rows x {k} (float32), rows sharded "
        f"over {num_devices} devices, signature '(n,k),(n)->(k)', reduce={{'n': 'sum'}}:")
  for f in fns.values():
    np.testing.assert_allclose(f(*args), want, rtol=1e-3, atol=1e-2)
  _table(fns, args, "x", 0, _interleaved_args(fns, args, repeats))

  def loglik(d):
    return np.asarray(-0.5 * np.sum(d * d), d.dtype)

  scalar = jax.ShapeDtypeStruct((), np.float32)
  fns = {
      "bp.pure_callback": jax.jit(lambda d: bp.pure_callback(
          loglik, scalar, d, signature="(n,k)->()", reduce={"n": "sum"})),
      "jax.pure_callback": jax.jit(lambda d: jax.pure_callback(loglik, scalar, d)),
  }
  print("  the same pattern through a host callback (a log-likelihood summed over the rows):")
  for f in fns.values():
    np.testing.assert_allclose(f(args[0]), loglik(x), rtol=1e-3)
  times = _interleaved_args(fns, args[:1], repeats)
  print(f"  {'call':<19} {'time':>9} {'vs batchpart':>12}")
  for name in fns:
    print(f"  {name:<19} {times[name] * 1e3:7.2f}ms "
          f"{times[name] / times['bp.pure_callback']:11.1f}x")
  print("  Each device sums its own rows and one all-reduce of one result combines them;\n"
        "  jax's calls gather every row first. shard_map + psum compiles to batchpart's\n"
        "  program: a gap between their times is timing noise. The docs' page 'Reductions'\n"
        "  says more.")


def _interleaved_args(fns: dict, args, rounds: int) -> dict:
  import jax
  best = {name: float("inf") for name in fns}
  for _ in range(rounds):
    for name, f in fns.items():
      t0 = time.perf_counter()
      jax.block_until_ready(f(*args))
      best[name] = min(best[name], time.perf_counter() - t0)
  return best


def run(*, num_devices: int = 8, repeats: int = 10, batch: int = 512, n: int = 32) -> int:
  _configure(num_devices)
  import jax
  import numpy as np
  from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

  import batchpart as bp

  mesh = jax.make_mesh((num_devices,), ("x",), axis_types=(AxisType.Auto,))
  a, reference = _spd_batch(batch, n)
  candidates = _candidates(mesh)
  print(f"batchpart demo: Cholesky of {batch} SPD matrices {n}x{n} (float32) on "
        f"{num_devices} simulated CPU devices, jax {jax.__version__}\n", flush=True)
  for label in _SPECS:
    spec = _spec(label)
    a_sharded = jax.device_put(a, NamedSharding(mesh, spec))
    rows = {}
    jitted = {}
    for name, f in candidates.items():
      print(f"  [{label}] compiling {name} ...", flush=True)
      # Every candidate returns its factors batch-sharded, as a user who goes
      # on with per-matrix work wants them.
      jitted[name] = jax.jit(f, out_shardings=NamedSharding(mesh, P("x")))
      with _without_xla_logs():
        rows[name] = _summary(bp.explain(jitted[name], a_sharded))
        np.testing.assert_allclose(jitted[name](a_sharded), reference, rtol=1e-3, atol=1e-3)
    print(f"  [{label}] timing ({repeats} interleaved rounds) ...", flush=True)
    times = _interleaved(jitted, a_sharded, repeats)
    print(f"  [{label}] jnp.linalg in a child process ...", flush=True)
    stock = _stock_row(label, num_devices, repeats, batch, n)
    print(f"\n{label} input, spec {spec}:")
    print(f"  {'call':<19} {'per-device operand':<19} {'collectives':<34} "
          f"{'devices/element':>15} {'time':>9} {'vs batchpart':>12}")
    for name, (shape, collectives, replication) in rows.items():
      _print_row(name, shape, collectives, replication, times[name],
                 times[name] / times["batchpart.linalg"])
    if isinstance(stock, str):
      print(f"  {'jnp.linalg':<19} {stock}")
    else:
      _print_row("jnp.linalg", *stock)
    print()
  print("All four give NumPy's factors, batch-sharded. 'devices/element' is how many devices\n"
        "compute each matrix (1 = no redundant work; '-' inside shard_map); 'vs batchpart' is\n"
        "each call's time over batchpart's, measured interleaved (jnp.linalg's in a child\n"
        "process of its own, against batchpart's there). The shard_map wrapper is right here\n"
        "only because its in_specs name the batch dim; it cannot follow other specs. On\n"
        "batch-sharded input it compiles to batchpart's per-device program: a gap between\n"
        "their times there is timing noise.\n")
  from batchpart._demo import kinds
  for section in (lambda: _callbacks(mesh, a, repeats),
                  lambda: _buffer_callbacks(mesh, a, repeats),
                  lambda: _reductions(mesh, num_devices, repeats),
                  lambda: kinds.combiner(mesh, num_devices, repeats),
                  lambda: kinds.halo(mesh, num_devices, repeats),
                  lambda: kinds.scan(mesh, num_devices, repeats)):
    with _without_xla_logs():
      section()
    print(flush=True)
  return 0


def _print_row(name, shape, collectives, replication, seconds, ratio) -> None:
  print(f"  {name:<19} {shape:<19} {collectives:<34} {replication:>15} "
        f"{seconds * 1e3:7.2f}ms {ratio:11.1f}x")
