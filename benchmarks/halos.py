"""Halo dims (``halo=``) on 8 simulated CPU devices: stock jax vs a
hand-written ``jax.shard_map`` + ``jax.lax.ppermute`` halo exchange vs
batchpart, interleaved in one process, under both partitioners.

  python benchmarks/halos.py            # prints the tables
  python benchmarks/halos.py --quick    # a smaller grid, fewer repeats

- ``laplacian``: ``batchpart_test_laplacian`` (the 5-point Laplacian, zero
  outside) stepped ``STEPS`` times in a ``lax.fori_loop`` (``u += 0.1 *
  lap(u)``) on an ``N x N`` float32 grid sharded ``P("a", "b")`` over a 2x4
  mesh. Stock: a plain ``jax.ffi.ffi_call``, which XLA gathers onto every
  device every step. By hand: a ``shard_map`` whose body exchanges one row
  and one column with each neighbour (``ppermute``), calls the kernel on the
  padded block and keeps its interior. batchpart: ``bp.ffi_call(...,
  halo={"n": 1, "m": 1})`` (the rule unstated: end windows shift inward,
  slabs of ``lo + hi``) and ``halo=bp.Halo(1, 1, ends="zero")`` (the
  hand-written exchange's slabs).
- ``causal``: ``batchpart_test_stencil`` with ``lo = K - 1``, ``hi = 0`` and
  zero before the start (a causal convolution of width ``K``), stepped in a
  ``lax.fori_loop`` on ``ROWS x N`` float32 sharded 8 ways along ``N``. By
  hand: one ``ppermute`` of the last ``K - 1`` columns to the next device.
- ``gaussian_filter`` / ``median_filter``: ``scipy.ndimage`` on an image
  sharded 8 ways by rows, through ``bp.pure_callback(..., halo=...)``, vs
  ``jax.pure_callback`` (the whole image on one device), vs by hand: a
  ``shard_map`` program that exchanges the halo rows, then the callback on
  each device's window in a second program (a host callback and a
  collective in one hand-written program have hung on simulated devices).

Every program's result is checked against the unsharded one bit for bit
before it is timed. The machine has 2 cores simulating 8 devices: the
numbers compare programs, not hardware.
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def laplacian_candidates(jax, bp, n: int, steps: int, partitioner: str):
  """The three compiled Laplacian programs under ``partitioner``, and the input."""
  import numpy as np
  from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
  jax.config.update("jax_use_shardy_partitioner", partitioner == "shardy")
  mesh = jax.make_mesh((2, 4), ("a", "b"), axis_types=(AxisType.Auto,) * 2)
  spec = NamedSharding(mesh, P("a", "b"))
  u = jax.device_put(np.random.default_rng(0).standard_normal((n, n), np.float32), spec)
  S = jax.ShapeDtypeStruct
  plain = lambda u: jax.ffi.ffi_call("batchpart_test_laplacian", S(u.shape, u.dtype))(u)
  halo = lambda u: bp.ffi_call("batchpart_test_laplacian", S(u.shape, u.dtype),
                               signature="(n,m)->(n,m)", halo={"n": 1, "m": 1})(u)
  zero = bp.Halo(1, 1, ends="zero")
  ends = lambda u: bp.ffi_call("batchpart_test_laplacian", S(u.shape, u.dtype),
                               signature="(n,m)->(n,m)", halo={"n": zero, "m": zero})(u)

  def by_hand(u):
    def body(block):
      block = _exchange(jax, block, 0, "a", 2)
      block = _exchange(jax, block, 1, "b", 4)
      return plain(block)[1:-1, 1:-1]
    return jax.shard_map(body, mesh=mesh, in_specs=P("a", "b"), out_specs=P("a", "b"))(u)

  def stepped(step):
    return jax.jit(lambda u: jax.lax.fori_loop(0, steps, lambda i, u: u + 0.1 * step(u), u))

  return ({name: stepped(step).lower(u).compile() for name, step in
           (("stock", plain), ("shard_map", by_hand), ("batchpart", halo),
            ("batchpart, ends", ends))}, u)


def causal_candidates(jax, bp, rows: int, n: int, k: int, steps: int, partitioner: str):
  """The causal convolution programs under ``partitioner``, and the input."""
  import numpy as np
  from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
  jax.config.update("jax_use_shardy_partitioner", partitioner == "shardy")
  mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))
  x = jax.device_put(np.random.default_rng(2).standard_normal((rows, n), np.float32),
                     NamedSharding(mesh, P(None, "x")))
  S = jax.ShapeDtypeStruct
  attrs = dict(rank=np.int64(1), lo=np.int64(k - 1), hi=np.int64(0), mode=np.int64(0))
  plain = lambda x: jax.ffi.ffi_call("batchpart_test_stencil", S(x.shape, x.dtype))(x, **attrs)
  declared = lambda ends: lambda x: bp.ffi_call(
      "batchpart_test_stencil", S(x.shape, x.dtype), signature="(n)->(n)",
      halo={"n": bp.Halo(k - 1, 0, ends=ends)})(x, **attrs)

  def by_hand(x):
    def body(block):
      import jax.numpy as jnp
      top = block[:, block.shape[1] - (k - 1):]
      below = jax.lax.ppermute(top, "x", [(i, i + 1) for i in range(7)])
      return plain(jnp.concatenate([below, block], axis=1))[:, k - 1:]
    return jax.shard_map(body, mesh=mesh, in_specs=P(None, "x"), out_specs=P(None, "x"))(x)

  def stepped(step):
    return jax.jit(lambda x: jax.lax.fori_loop(0, steps, lambda i, x: x + 0.01 * step(x), x))

  return ({name: stepped(step).lower(x).compile() for name, step in
           (("stock", plain), ("shard_map", by_hand), ("batchpart", declared(None)),
            ("batchpart, ends", declared("zero")))}, x)


def _exchange(jax, block, dim: int, axis: str, parts: int, width: int = 1):
  """``block`` with ``width`` elements of each neighbour along ``dim``
  (zeros past the array's ends), as a hand-written halo exchange does."""
  import jax.numpy as jnp
  size = block.shape[dim]
  top = jax.lax.slice_in_dim(block, size - width, size, axis=dim)
  bottom = jax.lax.slice_in_dim(block, 0, width, axis=dim)
  below = jax.lax.ppermute(top, axis, [(i, i + 1) for i in range(parts - 1)])
  above = jax.lax.ppermute(bottom, axis, [(i + 1, i) for i in range(parts - 1)])
  return jnp.concatenate([below, block, above], axis=dim)


def filter_candidates(jax, bp, n: int, filt, radius: int, partitioner: str):
  """The ndimage filter through bp.pure_callback, jax.pure_callback and by
  hand (exchange program, then a per-device callback program)."""
  import numpy as np
  from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
  jax.config.update("jax_use_shardy_partitioner", partitioner == "shardy")
  mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))
  img = jax.device_put(np.random.default_rng(1).standard_normal((n, n), np.float32),
                       NamedSharding(mesh, P("x")))
  S = jax.ShapeDtypeStruct
  part = n // 8
  as_np = lambda x: filt(np.asarray(x))
  batchpart = jax.jit(lambda x: bp.pure_callback(
      as_np, S(x.shape, x.dtype), x, signature="(n,m)->(n,m)", halo={"n": radius}))
  stock = jax.jit(lambda x: jax.pure_callback(as_np, S(x.shape, x.dtype), x))

  def windows(x):
    def body(block):
      return _exchange(jax, block, 0, "x", 8, radius)
    return jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x"))(x)

  def per_window(w):
    def body(block):
      # Each device's window, shifted inward at the ends as the kernel's
      # boundary rule needs: the padding rows a device did not receive are
      # replaced by its own rows further in.
      i = jax.lax.axis_index("x")
      out = jax.pure_callback(lambda b, i: _hand_filter(filt, b, int(i), radius, part),
                              S((part, n), block.dtype), block, i)
      return out
    return jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x"))(w)

  exchange, call = jax.jit(windows), jax.jit(per_window)
  by_hand = lambda x: call(exchange(x))
  return {"stock": stock, "shard_map": by_hand, "batchpart": batchpart}, img


def _hand_filter(filt, block, i: int, radius: int, part: int):
  """The filter on one device's exchanged block ``[below, own, above]``,
  its window moved inward at the array's ends, and the part kept."""
  import numpy as np
  block = np.asarray(block)
  if i == 0:
    window, keep = block[radius:], 0                 # own + above
  elif i == 7:
    window, keep = block[:part + radius], radius     # below + own
  else:
    window, keep = block, radius
  return filt(window)[keep:keep + part]


def main(argv):
  quick = "--quick" in argv
  sys.path.insert(0, HERE)
  import numpy as np
  import scipy.ndimage as ndi
  from _timing import fmt_time, interleaved, simulated_devices
  jax = simulated_devices()

  import batchpart as bp
  import batchpart.testing

  batchpart.testing.register()
  n, steps = (1024, 10) if quick else (4096, 50)
  repeats = 3 if quick else 5
  print(f"# Laplacian, {n}x{n} float32, {steps} steps in fori_loop, 2x4 mesh\n")
  print("| partitioner | program | time | vs batchpart |\n| --- | --- | ---: | ---: |")
  for partitioner in ("shardy", "gspmd"):
    programs, u = laplacian_candidates(jax, bp, n, steps, partitioner)
    want = np.asarray(programs["stock"](u))
    for name, f in programs.items():
      assert np.array_equal(np.asarray(f(u)), want), name
      kinds = {c.opcode for c in _collectives(f)}
      print(f"<!-- {partitioner} {name}: collectives {sorted(kinds)} -->")
    times = interleaved(programs, (u,), repeats=repeats, min_time=0.5)
    for name, t in times.items():
      print(f"| {partitioner} | {name} | {fmt_time(t)} | {t / times['batchpart']:.2f}x |")
  rows, length, k = (8, 1 << 15, 8) if quick else (8, 1 << 18, 16)
  print(f"\n# causal convolution, width {k}, {rows}x{length} float32, {steps} steps, "
        "8 devices\n")
  print("| partitioner | program | time | vs batchpart |\n| --- | --- | ---: | ---: |")
  for partitioner in ("shardy", "gspmd"):
    programs, x = causal_candidates(jax, bp, rows, length, k, steps, partitioner)
    want = np.asarray(programs["stock"](x))
    for name, f in programs.items():
      assert np.array_equal(np.asarray(f(x)), want), name
      moved = sum(t.nbytes for c in _collectives(f) if c.opcode == "collective-permute"
                  for t in c.result_types)
      print(f"<!-- {partitioner} {name}: collective-permute bytes {moved} -->")
    times = interleaved(programs, (x,), repeats=repeats, min_time=0.5)
    for name, t in times.items():
      print(f"| {partitioner} | {name} | {fmt_time(t)} | {t / times['batchpart']:.2f}x |")
  if "--no-filters" in argv:
    return
  m = 1024 if quick else 2048
  for label, filt, radius in (
      ("gaussian_filter(sigma=2)", lambda x: ndi.gaussian_filter(x, 2.0), int(4 * 2.0 + 0.5)),
      ("median_filter(size=5)", lambda x: ndi.median_filter(x, size=5), 2)):
    print(f"\n# scipy.ndimage.{label}, {m}x{m} float32, rows sharded 8 ways\n")
    print("| partitioner | program | time | vs batchpart |\n| --- | --- | ---: | ---: |")
    whole = None
    for partitioner in ("shardy", "gspmd"):
      programs, img = filter_candidates(jax, bp, m, filt, radius, partitioner)
      whole = filt(np.asarray(img)) if whole is None else whole
      for name, f in programs.items():
        assert np.array_equal(np.asarray(f(img)), whole), (label, name)
      times = interleaved(programs, (img,), repeats=repeats, min_time=0.5)
      for name, t in times.items():
        print(f"| {partitioner} | {name} | {fmt_time(t)} | {t / times['batchpart']:.2f}x |")


def _collectives(compiled):
  from batchpart import _hlo
  return _hlo.collectives(compiled.as_text())


if __name__ == "__main__":
  main(sys.argv[1:])
