"""Scanned dims in Explicit mode, inside a ``shard_map`` (Manual), through a
``jax.export`` round trip and across processes sharing the persistent
compilation cache."""

import re

import jax
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import batchpart.testing as bt

from helpers import run_sharing_a_cache

S = jax.ShapeDtypeStruct
pytestmark = pytest.mark.timeout(300)
PREFIX = "batchpart_test_prefix_sum"


def _data(shape, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.integers(-2**20, 2**20, shape).astype(np.int32)
  return x, rng.integers(-2**20, 2**20, shape[:-1]).astype(np.int32)


def _want(x, s0):
  return (np.cumsum(x, -1) + s0[..., None]).astype(np.int32), (s0 + x.sum(-1)).astype(np.int32)


def _prefix(shape, parallel=True):
  import batchpart as bp
  scan = bp.Scan((1, 1), merge=bt.add_merge if parallel else None)
  return bp.ffi_call(PREFIX, (S(shape, np.int32), S(shape[:-1], np.int32)),
                     signature="(t),()->(t),()", scan={"t": scan})


def _gathers(text):
  return [line for line in text.splitlines() if re.search(r"\ball-gather(-start)?\(", line)]


@pytest.mark.parametrize("parallel", [True, False])
def test_explicit_mesh_types_the_results(partitioner, parallel):
  mesh = jax.make_mesh((2, 4), ("a", "b"), axis_types=(AxisType.Explicit,) * 2)
  x, s0 = _data((4, 32))
  f = _prefix(x.shape, parallel)
  with jax.set_mesh(mesh):
    args = (jax.device_put(x, NamedSharding(mesh, P("a", "b"))),
            jax.device_put(s0, NamedSharding(mesh, P("a"))))
    fn = jax.jit(lambda x, s: f(x, s, reverse=np.int64(0)))
    y, total = fn(*args)
    assert jax.typeof(y).sharding.spec == P("a", "b")
    assert jax.typeof(total).sharding.spec == P("a")
  for got, want in zip((y, total), _want(x, s0)):
    np.testing.assert_array_equal(np.asarray(got), want)


def test_inside_shard_map_each_device_scans_its_block(partitioner, mesh8):
  """Manual mode: the body sees its block and the state, and carrying the
  state between blocks is the body's job, as for every batchpart call."""
  x, s0 = _data((2, 64), 1)
  f = _prefix((2, 8))
  fn = jax.jit(jax.shard_map(lambda x, s: f(x, s, reverse=np.int64(0)), mesh=mesh8,
                             in_specs=(P(None, "x"), P()), out_specs=(P(None, "x"), P("x")),
                             check_vma=False))
  y, totals = fn(jax.device_put(x, NamedSharding(mesh8, P(None, "x"))), s0)
  blocks = [_want(x[:, 8 * k:8 * k + 8], s0) for k in range(8)]
  np.testing.assert_array_equal(np.asarray(y), np.concatenate([b[0] for b in blocks], 1))
  np.testing.assert_array_equal(np.asarray(totals), np.concatenate([b[1] for b in blocks]))


def test_export_round_trip_keeps_the_scan(partitioner, mesh8):
  """Exported under each partitioner, called under Shardy: the derived name
  carries the scan and its merge's digest, which this process declared."""
  x, s0 = _data((4, 64), 2)
  f = _prefix(x.shape)
  exported = jax.export.export(
      jax.jit(lambda x, s: f(x, s, reverse=np.int64(0))),
      disabled_checks=[jax.export.DisabledSafetyCheck.custom_call(PREFIX)])(
      S(x.shape, x.dtype, sharding=NamedSharding(mesh8, P(None, "x"))),
      S(s0.shape, s0.dtype, sharding=NamedSharding(mesh8, P())))
  assert re.search(r"\$t:t=1\.1\.scan_[0-9a-f]{16}", exported.mlir_module())
  restored = jax.export.deserialize(exported.serialize())
  previous = jax.config.jax_use_shardy_partitioner
  jax.config.update("jax_use_shardy_partitioner", True)
  try:
    fn = jax.jit(restored.call)
    args = (jax.device_put(x, NamedSharding(mesh8, P(None, "x"))),
            jax.device_put(s0, NamedSharding(mesh8, P())))
    out, text = fn(*args), fn.lower(*args).compile().as_text()
  finally:
    jax.config.update("jax_use_shardy_partitioner", previous)
  for got, want in zip(out, _want(x, s0)):
    np.testing.assert_array_equal(np.asarray(got), want)
  gathers = _gathers(text)
  assert len(gathers) == 1 and "[8,4]" in gathers[0], gathers


CACHE_SCRIPT = """
    mode = sys.argv[2]
    import batchpart.testing as bt
    bt.register()
    S = jax.ShapeDtypeStruct
    package = lambda x, s: jax.ffi.ffi_call("batchpart_test_prefix_sum", (
        S(x.shape, x.dtype), S(s.shape, s.dtype)))(x, s, reverse=np.int64(mode == "reverse"))
    x = np.arange(128, dtype=np.int32).reshape(2, 64)
    s0 = np.array([3, -3], np.int32)
    want = [np.asarray(w) for w in package(x, s0)]
    merge = None if mode == "sequential" else bt.add_merge
    bp.partition_ffi_target("batchpart_test_prefix_sum", signature="(t),()->(t),()",
                            scan={"t": bp.Scan((1, 1), merge=merge,
                                               reverse=mode == "reverse")})
    mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))
    args = (jax.device_put(x, NamedSharding(mesh, P(None, "x"))), s0)
    f = jax.jit(package)
    text = f.lower(*args).compile().as_text()
    assert ("collective-permute" in text) == (mode == "sequential"), text
    for got, w in zip(f(*args), want):
        np.testing.assert_array_equal(np.asarray(got), w)
"""


@pytest.mark.timeout(500)
def test_the_persistent_cache_keeps_scan_modes_apart(tmp_path):
  """One target declared parallel, sequential, reversed and parallel again,
  each in a fresh process reading the cache the others wrote: the mode is
  part of the call's derived name, so no process loads another's program."""
  run_sharing_a_cache(CACHE_SCRIPT, tmp_path, ("parallel", "sequential", "reverse",
                                               "parallel"), timeout=300)
