"""The demo's sections on three kinds of core dim: a named combiner
(attention over sharded keys, merged by logsumexp), a halo (a stencil over a
sharded dim, its windows exchanged with the neighbours) and a scan (a linear
recurrence over a sharded dim, in two passes around one all-gather)."""

from __future__ import annotations

from batchpart._demo import _interleaved_args, _table


def combiner(mesh, num_devices: int, repeats: int) -> None:
  """Attention over keys and values sharded ``num_devices`` ways: batchpart's
  logsumexp combiner against jax's call and a shard_map with the merge by hand."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax.sharding import NamedSharding, PartitionSpec as P

  import batchpart as bp
  from batchpart import testing

  testing.register()
  target = "batchpart_test_attention"
  nq, nk, d, e = 32, 512 * num_devices, 16, 16
  rng = np.random.default_rng(2)
  q = rng.standard_normal((nq, d), dtype=np.float32) / np.float32(np.sqrt(d))
  k = rng.standard_normal((nk, d), dtype=np.float32)
  v = rng.standard_normal((nk, e), dtype=np.float32)
  bias = np.zeros((nk,), np.float32)
  out = (jax.ShapeDtypeStruct((nq, e), np.float32), jax.ShapeDtypeStruct((nq,), np.float32))
  plain = lambda *a: jax.ffi.ffi_call(target, out)(*a)

  def by_hand(q, k, v, bias):
    # Each device's (o, lse) over its own keys, rescaled to the largest lse
    # so that the exponentials cannot overflow, then summed.
    o, lse = plain(q, k, v, bias)
    top = jax.lax.pmax(lse, "x")
    w = jnp.exp(lse - top)
    z = jax.lax.psum(w, "x")
    return jax.lax.psum(w[:, None] * o, "x") / z[:, None], top + jnp.log(z)

  fns = {
      "bp.ffi_call": jax.jit(bp.ffi_call(
          target, out, signature="(q,d),(n,d),(n,e),(n)->(q,e),(q)",
          reduce={"n": "logsumexp"})),
      "jax.ffi.ffi_call": jax.jit(plain),
      "shard_map by hand": jax.jit(jax.shard_map(
          by_hand, mesh=mesh, in_specs=(P(), P("x"), P("x"), P("x")),
          out_specs=(P(), P()), check_vma=False)),
  }
  args = (jax.device_put(q, NamedSharding(mesh, P())),
          *(jax.device_put(a, NamedSharding(mesh, P("x"))) for a in (k, v, bias)))
  # The unsharded call: jax's own, on one device.
  want = jax.block_until_ready(jax.jit(plain)(q, k, v, bias))
  print(f"named combiner: attention of {nq} queries over {nk} keys and values "
        f"(d = e = {d}, float32), keys sharded over {num_devices} devices,\n"
        f"signature '(q,d),(n,d),(n,e),(n)->(q,e),(q)', reduce={{'n': 'logsumexp'}}:")
  same = True
  for f in fns.values():
    got = jax.block_until_ready(f(*args))
    same &= all(np.allclose(g, w, rtol=1e-4, atol=1e-5) for g, w in zip(got, want))
  _table(fns, args, "keys", 1, _interleaved_args(fns, args, repeats))
  print(f"  (o, lse) allclose to the unsharded call, all three: {same}")
  print("  Each device attends to its own keys and a few all-reduces of (q,e) and (q)\n"
        "  merge them; jax's call gathers every key and value onto every device. The\n"
        "  docs' page 'Reductions' (Named combiners) says more.")


def halo(mesh, num_devices: int, repeats: int) -> None:
  """A stencil along a dim sharded ``num_devices`` ways: batchpart's halo
  exchange against jax's call and a shard_map + ppermute by hand."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax.sharding import NamedSharding, PartitionSpec as P

  import batchpart as bp
  from batchpart import testing

  testing.register()
  target = "batchpart_test_stencil"
  lo, hi = 2, 1
  rows, n = 16, 4096 * num_devices
  rng = np.random.default_rng(3)
  x = rng.standard_normal((rows, n), dtype=np.float32)
  out = jax.ShapeDtypeStruct(x.shape, x.dtype)
  # The zero boundary rule, stated (ends="zero"): the hand-written exchange
  # pads the array's ends with zeros, the same sum as the kernel's own rule,
  # and batchpart's moves the same lo and hi columns.
  attrs = {"rank": np.int64(1), "lo": np.int64(lo), "hi": np.int64(hi),
           "mode": np.int64(testing.HALO_MODES["zero"])}
  plain = lambda x: jax.ffi.ffi_call(target, jax.ShapeDtypeStruct(x.shape, x.dtype))(
      x, **attrs)

  def by_hand(block):
    # The last lo columns of the left neighbour and the first hi of the right
    # one (zeros at the array's ends), the kernel on the window, its middle kept.
    size, parts = block.shape[-1], num_devices
    left = jax.lax.ppermute(block[:, size - lo:], "x", [(i, i + 1) for i in range(parts - 1)])
    right = jax.lax.ppermute(block[:, :hi], "x", [(i + 1, i) for i in range(parts - 1)])
    return plain(jnp.concatenate([left, block, right], axis=-1))[:, lo:lo + size]

  spec = P(None, "x")
  fns = {
      "bp.ffi_call": jax.jit(lambda x: bp.ffi_call(
          target, out, signature="(n)->(n)",
          halo={"n": bp.Halo(lo, hi, ends="zero")})(x, **attrs)),
      "jax.ffi.ffi_call": jax.jit(plain),
      "shard_map by hand": jax.jit(jax.shard_map(
          by_hand, mesh=mesh, in_specs=spec, out_specs=spec)),
  }
  arg = jax.device_put(x, NamedSharding(mesh, spec))
  want = np.asarray(jax.block_until_ready(jax.jit(plain)(x)))
  print(f"halo: a stencil (y[i] = sum over a in [-{lo}, {hi}] of w_a x[i + a]) along {n} "
        f"columns of {rows} rows\n(float32), columns sharded over {num_devices} devices, "
        f"signature '(n)->(n)', halo={{'n': bp.Halo({lo}, {hi}, ends='zero')}}:")
  same = True
  for f in fns.values():
    same &= bool(np.array_equal(np.asarray(jax.block_until_ready(f(arg))), want))
  _table(fns, (arg,), "window", 0, _interleaved_args(fns, (arg,), repeats))
  print(f"  equal to the unsharded call bit for bit, all three: {same}")
  print(f"  Each device calls the kernel on its part and {lo} + {hi} columns of its "
        "neighbours,\n  exchanged by collective-permutes (the bytes of the hand-written "
        "exchange: the\n  kernel's zero rule stated); jax's call gathers the whole array onto "
        "every device.\n  The docs' page 'Halos' says more.")


def scan(mesh, num_devices: int, repeats: int) -> None:
  """A linear recurrence along a dim sharded ``num_devices`` ways:
  batchpart's two passes against jax's call and a shard_map by hand."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax.sharding import NamedSharding, PartitionSpec as P

  from batchpart import testing

  testing.register()
  target = "batchpart_test_linear_scan"
  rows, n = 8, 8192 * num_devices
  rng = np.random.default_rng(4)
  a = rng.uniform(0.9, 1.0, (rows, n)).astype(np.float32)
  x = rng.standard_normal((rows, n)).astype(np.float32)
  h0 = rng.standard_normal((rows,)).astype(np.float32)
  S = jax.ShapeDtypeStruct
  types = lambda shape: (S(shape, np.float32), S(shape[:-1], np.float32),
                         S(shape[:-1], np.float32))
  rev = np.int64(0)
  plain = lambda a, x, h: jax.ffi.ffi_call(target, types(a.shape))(a, x, h, reverse=rev)

  def by_hand(a, x, h):
    # Pass 1 from zero, one all-gather of (h_T, prod a), the parts before
    # this one folded onto h, pass 2 from there.
    _, h_t, prod = plain(a, x, jnp.zeros_like(h))
    hs, ps = jax.lax.all_gather(h_t, "x"), jax.lax.all_gather(prod, "x")
    me, state, final = jax.lax.axis_index("x"), h, h
    for p in range(num_devices):
      state = jnp.where(p < me, ps[p] * state + hs[p], state)
      final = ps[p] * final + hs[p]
    return plain(a, x, state)[0], final

  seq = P(None, "x")
  scanned = testing.linear_scan((rows, n), np.float32)
  fns = {
      "bp.ffi_call": jax.jit(lambda a, x, h: scanned(a, x, h, reverse=rev)[:2]),
      "jax.ffi.ffi_call": jax.jit(lambda a, x, h: plain(a, x, h)[:2]),
      "shard_map by hand": jax.jit(jax.shard_map(
          by_hand, mesh=mesh, in_specs=(seq, seq, P()), out_specs=(seq, P()),
          check_vma=False)),
  }
  args = (jax.device_put(a, NamedSharding(mesh, seq)), jax.device_put(x, NamedSharding(mesh, seq)),
          jax.device_put(h0, NamedSharding(mesh, P())))
  want = [np.asarray(w) for w in jax.jit(plain)(a, x, h0)[:2]]
  print(f"scan: a linear recurrence (h[t] = a[t] h[t-1] + x[t]) along {n} steps of {rows} "
        f"rows\n(float32), steps sharded over {num_devices} devices, signature "
        "'(t),(t),()->(t),(),()', scan={'t': bp.Scan(state=(2, 1), merge, apply)}:")
  close = True
  for f in fns.values():
    got = jax.block_until_ready(f(*args))
    close &= all(np.allclose(np.asarray(g), w, rtol=1e-4, atol=1e-4) for g, w in zip(got, want))
  _table(fns, args, "a", 0, _interleaved_args(fns, args, repeats))
  print(f"  (y, h_T) allclose to the unsharded call, all three: {close}")
  print("  Each device runs its part from zero, the parts' (h_T, prod a) are all-gathered,\n"
        "  folded, and each device runs its part again from its true start; jax's call\n"
        "  gathers the whole sequence onto every device. The docs' page 'Scans' says more.")
