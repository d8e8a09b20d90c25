"""Named combiners on 8 simulated CPU devices (this machine's cores): stock
jax vs a hand-written ``jax.shard_map`` merge vs batchpart, interleaved in
one process, under both partitioners (Shardy, then GSPMD).

  python benchmarks/combiners.py          # prints the markdown tables
  python benchmarks/combiners.py --quick
  python benchmarks/combiners.py attention     # one case

- ``attention``: ``batchpart_test_attention`` (``(q,d),(n,d),(n,e),(n)->(q,e),(q)``,
  softmax attention with a key bias, a plain C++ loop) with the keys and
  values sharded 8 ways, queries replicated. Stock ``jax.ffi.ffi_call``
  gathers K and V and every device runs all keys; by hand, ``shard_map``
  runs the kernel on each device's keys and merges with ``pmax``/``psum``;
  batchpart declares ``reduce={"n": "logsumexp"}``.
- ``knn``: ``faiss.knn`` (exact L2, one OpenMP thread per call: 8 devices
  share the cores) through a host callback with the database sharded 8 ways.
  Stock ``jax.pure_callback`` runs one call over the whole database on
  device 0; by hand, ``shard_map`` calls faiss per device and offsets the
  labels, then a second program takes the k smallest of all candidates;
  batchpart declares ``reduce={"n": "min_k"}`` on ``bp.pure_callback``.

Every call blocks until its result is ready (``_timing.interleaved``).
On simulated CPU devices a program with ``jax.pure_callback`` and a
collective can stall in XLA's CPU rendezvous until its 40 s timeout ends the
process (docs/callbacks.md): each partitioner's kNN runs in a child process
under a time limit, with stock first, and without stock where that child
fails. By hand is two programs for the same reason (the per-device calls,
then the merge), as in benchmarks/callbacks.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main(quick: bool) -> None:
  import jax
  jax.config.update("jax_num_cpu_devices", 8)
  jax.config.update("jax_cpu_enable_async_dispatch", False)
  sys.path.insert(0, HERE)
  import _timing
  import numpy as np

  import batchpart.testing as kernels
  kernels.register()
  repeats = 3 if quick else 7
  mesh = jax.make_mesh((8,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))
  if "--knn-child" in sys.argv:
    partitioner = sys.argv[sys.argv.index("--knn-child") + 1]
    rows = _knn(jax, np, _timing, mesh, repeats, quick, partitioner, "--stock" in sys.argv)
    print(json.dumps(rows))
    return
  cases = {"attention": _attention, "knn": _knn_in_children}
  for title in [c for c in cases if c in sys.argv] or list(cases):
    rows = cases[title](jax, np, _timing, mesh, repeats, quick)
    print(f"\n### {title}\n")
    _timing.print_comparison(rows, "batchpart", title)


def _attention(jax, np, _timing, mesh, repeats, quick):
  from jax.sharding import NamedSharding, PartitionSpec as P

  import batchpart as bp
  nq, nk, d, e = (32, 2048, 32, 32) if quick else (64, 16384, 64, 64)
  rng = np.random.default_rng(0)
  q = rng.standard_normal((nq, d)).astype(np.float32) / np.sqrt(d)
  k = rng.standard_normal((nk, d)).astype(np.float32)
  v = rng.standard_normal((nk, e)).astype(np.float32)
  bias = np.zeros((nk,), np.float32)
  out = (jax.ShapeDtypeStruct((nq, e), np.float32), jax.ShapeDtypeStruct((nq,), np.float32))
  target = "batchpart_test_attention"
  args = (jax.device_put(q, NamedSharding(mesh, P())),
          *(jax.device_put(a, NamedSharding(mesh, P("x"))) for a in (k, v, bias)))
  local_out = (jax.ShapeDtypeStruct((nq, e), np.float32),
               jax.ShapeDtypeStruct((nq,), np.float32))

  def by_hand(q, k, v, bias):
    o, lse = jax.ffi.ffi_call(target, local_out)(q, k, v, bias)
    top = jax.lax.pmax(lse, "x")
    w = jax.numpy.exp(lse - top)
    z = jax.lax.psum(w, "x")
    return jax.lax.psum(w[:, None] * o, "x") / z[:, None], top + jax.numpy.log(z)

  def candidates():
    stock = jax.jit(lambda *a: jax.ffi.ffi_call(target, out)(*a))
    hand = jax.jit(jax.shard_map(by_hand, mesh=mesh, in_specs=(P(), P("x"), P("x"), P("x")),
                                 out_specs=(P(), P()), check_vma=False))
    ours = jax.jit(bp.ffi_call(target, out, signature="(q,d),(n,d),(n,e),(n)->(q,e),(q)",
                               reduce={"n": "logsumexp"}))
    return {"stock": (stock, stock), "shard_map": (hand, hand), "batchpart": (ours, ours)}

  o_ref, lse_ref = kernels_reference(q, k, v, bias)

  def check(result):
    np.testing.assert_allclose(np.asarray(result[0]), o_ref, rtol=2e-3, atol=2e-4)
    np.testing.assert_allclose(np.asarray(result[1]), lse_ref, rtol=2e-4, atol=2e-4)

  return _timing.under_both_partitioners(candidates, args, check, repeats=repeats)


def kernels_reference(q, k, v, bias):
  import batchpart.testing as kernels
  return kernels.attention_reference(q, k, v, bias)


# Per partitioner, the seconds a kNN child may run: compiling and timing
# everything takes one to two minutes on 2 shared cores; XLA ends a stalled
# rendezvous after 40 s, and a stall it never ends is cut here.
_KNN_CHILD_SECONDS = 300


def _knn_in_children(jax, np, _timing, mesh, repeats, quick):
  """The kNN rows, each partitioner's in a child process: first with stock;
  where that child fails or runs out of time, the failure is printed and the
  others are timed without stock (tried twice). A partitioner whose children
  all fail has no rows."""
  del jax, np, _timing, mesh, repeats
  rows = []
  for partitioner in ("shardy", "gspmd"):
    for stock in (True, False, False):
      args = [sys.executable, __file__, "--knn-child", partitioner,
              *(["--stock"] if stock else []), *(["--quick"] if quick else [])]
      try:
        proc = subprocess.run(args, stdout=subprocess.PIPE, text=True,
                              timeout=_KNN_CHILD_SECONDS)
      except subprocess.TimeoutExpired:
        failure = f"no result in {_KNN_CHILD_SECONDS} s"
      else:
        lines = proc.stdout.strip().splitlines()
        if proc.returncode == 0 and lines:
          print("\n".join(lines[:-1]))
          rows += [tuple(r) for r in json.loads(lines[-1])]
          break
        failure = f"exit status {proc.returncode}"
      print(f"knn under {partitioner}, {'with' if stock else 'without'} stock: the child "
            f"failed ({failure})", flush=True)
  return rows


def _knn(jax, np, _timing, mesh, repeats, quick, partitioner, stock):
  import faiss
  from jax.sharding import NamedSharding, PartitionSpec as P

  import batchpart as bp
  faiss.omp_set_num_threads(1)
  nq, nb, d, kk = (64, 8192, 32, 10) if quick else (256, 65536, 64, 10)
  rng = np.random.default_rng(1)
  xq = rng.standard_normal((nq, d)).astype(np.float32)
  xb = rng.standard_normal((nb, d)).astype(np.float32)
  args = (jax.device_put(xq, NamedSharding(mesh, P())),
          jax.device_put(xb, NamedSharding(mesh, P("x"))))

  def knn(xq, xb):
    dist, labels = faiss.knn(np.ascontiguousarray(xq), np.ascontiguousarray(xb), kk)
    return dist, labels.astype(np.int32)

  out = (jax.ShapeDtypeStruct((nq, kk), np.float32), jax.ShapeDtypeStruct((nq, kk), np.int32))

  def partials(xq, xb):
    dist, labels = jax.pure_callback(knn, out, xq, xb)
    return dist[None], (labels + jax.lax.axis_index("x") * xb.shape[0])[None]

  def merge(dist, labels):
    dist = dist.transpose(1, 0, 2).reshape(nq, -1)
    labels = labels.transpose(1, 0, 2).reshape(nq, -1)
    neg, at = jax.lax.top_k(-dist, kk)
    return -neg, jax.numpy.take_along_axis(labels, at, 1)

  def candidates():
    # Two programs: a collective in the callback's program can stall (module
    # docstring).
    per_device = jax.jit(jax.shard_map(partials, mesh=mesh, in_specs=(P(), P("x")),
                                       out_specs=(P("x"), P("x")), check_vma=False))
    merged = jax.jit(merge)
    # The merge waits for every device's call: jax's callback moves its
    # operands onto device 0, which must not be in the merge's collective
    # by then.
    hand = lambda xq, xb: merged(*jax.block_until_ready(per_device(xq, xb)))
    ours = jax.jit(lambda xq, xb: bp.pure_callback(
        knn, out, xq, xb, signature="(q,d),(n,d)->(q,k),(q,k)", reduce={"n": "min_k"}))
    made = {"shard_map": (hand, per_device), "batchpart": (ours, ours)}
    if stock:
      # Each call waits for its result: where device 0 is still in the
      # callback when the others start the next call's all-gather, its
      # transfer of the operands stalls (docs/callbacks.md).
      whole = jax.jit(lambda xq, xb: jax.pure_callback(knn, out, xq, xb))
      made = {"stock": (lambda *a: jax.block_until_ready(whole(*a)), whole), **made}
    return made

  ref_dist, _ = faiss.knn(xq, xb, kk)

  def check(result):
    np.testing.assert_allclose(np.asarray(result[0]), ref_dist, rtol=1e-4, atol=1e-3)

  rows = _timing.under_both_partitioners(candidates, args, check, repeats=repeats,
                                         partitioners=(partitioner,))
  # Stock's work alone, one faiss call over the whole database on the host:
  # a lower bound on stock's time (no gather, no transfer).
  host = _timing.interleaved({"stock": knn}, (xq, xb), repeats=repeats)["stock"]
  print(f"knn ({partitioner}), one faiss call over the whole database on the host "
        f"(no jax): {_timing.fmt_time(host).strip()}")
  return rows


if __name__ == "__main__":
  main("--quick" in sys.argv)
