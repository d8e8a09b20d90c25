"""Layouts the example-based tests never drew, each once as written, under
Shardy and GSPMD: a top-k whose k is not the results' last dim, a top-k
whose results have no k, logsumexp with batch dims after the core dims,
callbacks whose results keep the reduced dim, a callback halo over a
sharded batch dim of size 1, and a Combiner that cannot run where it is
merged. ``test_layouts_property`` draws such layouts at random; these are
the ones found first."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import batchpart as bp
from batchpart._partition import export as partition_export
from batchpart._vocab.dims import user_combiner
from batchpart.testing import layouts

from helpers import put

ROUTES = {"ffi": layouts.ffi_call, "callback": layouts.pure_callback}


def _sizes(**sizes):
  return {"0": 4, "1": 1, "k": 2, "j": 3, "e": 4, "m": 1, "n": 16, **sizes}


def _data(roles, sizes, seed=0):
  rng = np.random.default_rng(seed)
  return [rng.integers(-4, 5, [sizes[r] for r in rs]).astype(np.float32) for rs in roles]


def _run(route, op, operands, results, sizes, mesh, specs, *, seed=0, **declaration):
  xs = _data(operands, sizes, seed)
  call = ROUTES[route](op, operands, results, sizes, **declaration)
  got = jax.jit(call)(*(put(x, mesh, s) for x, s in zip(xs, specs)))
  return got, layouts.compute(op, operands, results, *xs, k=sizes["k"])


@pytest.mark.parametrize("route", sorted(ROUTES))
@pytest.mark.parametrize("op", ["max_k", "min_k"])
@pytest.mark.parametrize("operands, results", [
    (["n0"], ["k0", "k0"]),              # (n,...)->(k,...),(k,...): batch dims after
    (["nj"], ["kj", "kj"]),              # (n,j)->(k,j),(k,j): a core dim after k
    (["0nj"], ["0kj", "0kj"]),
])
def test_top_k_reads_k_where_it_is_declared(partitioner, mesh8, route, op, operands,
                                            results):
  sizes = _sizes(k=3, j=4, n=48)   # parts of 6 >= k: n is split
  specs = [P(*["x" if r == "n" else None for r in operands[0]])]
  got, want = _run(route, op, operands, results, sizes, mesh8, specs,
                   reduce={"n": op})
  for g, w in zip(got, want):
    np.testing.assert_array_equal(np.asarray(g), w)


def test_top_k_without_a_k_dim_is_refused_by_every_entry_point():
  types = [jax.ShapeDtypeStruct((4,), np.float32), jax.ShapeDtypeStruct((4,), np.int32)]
  message = r"reduce 'max_k' over the dim\(s\) n: result 0 \(the values\) has no core dim k"
  with pytest.raises(ValueError, match=r"batchpart.ffi_call\('t'\): " + message):
    bp.ffi_call("t", types, signature="(n)->(),()", reduce={"n": "max_k"})
  with pytest.raises(ValueError, match=r"batchpart.pure_callback\(.*\): " + message):
    bp.pure_callback(lambda x: x, types, np.zeros((4, 8), np.float32), signature="(n)->(),()",
                     reduce={"n": "max_k"})
  with pytest.raises(ValueError, match=r"batchpart.partition_ffi_target\('t'\): " + message):
    bp.partition_ffi_target("t", signature="(n)->(),()", reduce={"n": "max_k"})
  with pytest.raises(ValueError, match=r"batchpart.batch_partitionable\(.*\): " + message):
    bp.batch_partitionable(signature="(n)->(),()", reduce={"n": "max_k"})(lambda x: x)


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_logsumexp_with_batch_dims_after_the_core_dims(partitioner, mesh8, route):
  """``(n,...),(n,e,...)->(e,...),(...)`` where e equals the batch size: the
  weights go along the batch, not along e."""
  sizes = _sizes(e=4)
  operands, results = ["n0", "ne0"], ["e0", "0"]
  xs = _data(operands, sizes, seed=3)
  xs[0] = np.random.default_rng(4).standard_normal(xs[0].shape).astype(np.float32)
  call = ROUTES[route]("logsumexp", operands, results, sizes, reduce={"n": "logsumexp"})
  got = jax.jit(call)(put(xs[0], mesh8, P("x")), put(xs[1], mesh8, P("x")))
  for g, w in zip(got, layouts.compute("logsumexp", operands, results, *xs)):
    np.testing.assert_allclose(np.asarray(g), w, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("adopt", [False, True], ids=["pure_callback", "partition_callback"])
@pytest.mark.parametrize("kind", ["sum", "max", "argmax", "logsumexp", "combiner"])
@pytest.mark.parametrize("kept_first", [False, True])
def test_callbacks_with_a_kept_result(partitioner, mesh8, adopt, kind, kept_first):
  """``(n)->(),(n)`` and ``(n)->(n),()``, no batch dim sharded."""
  op = "sum" if kind == "combiner" else kind
  operands = ["n", "ne"][:2 if kind == "logsumexp" else 1]
  combining = {"argmax": ["", ""], "logsumexp": ["e", ""]}.get(kind, [""])
  results = ["n", *combining] if kept_first else [*combining, "n"]
  sizes = _sizes()
  reduce = {"n": bp.Combiner(lambda a, b: (a[0] + b[0],)) if kind == "combiner" else kind}
  xs = _data(operands, sizes, seed=5)
  want = layouts.compute(op, operands, results, *xs)
  types = tuple(layouts.result_types(op, results, sizes))
  signature = layouts.signature(operands, results)

  def host(*args):
    return tuple(layouts.compute(op, operands, results, *map(np.asarray, args)))

  if adopt:
    bp.partition_callback(host, signature=signature, reduce=reduce)
    try:
      got = jax.jit(lambda *a: jax.pure_callback(host, types, *a))(
          *(put(x, mesh8, P("x")) for x in xs))
    finally:
      bp.unpartition(host)
  else:
    got = jax.jit(lambda *a: bp.pure_callback(host, types, *a, signature=signature,
                                              reduce=reduce))(
        *(put(x, mesh8, P("x")) for x in xs))
  for g, w in zip(got, want):
    np.testing.assert_allclose(np.asarray(g), w, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_halo_over_a_sharded_batch_dim_of_size_one(partitioner, mesh8, route):
  sizes = _sizes(**{"0": 1, "n": 48})
  x = _data(["0n"], sizes)[0]
  call = ROUTES[route]("halo", ["0n"], ["0n"], sizes, lo=1, hi=1, halo={"n": 1})
  spec = NamedSharding(mesh8, P("x", None))
  (got,) = jax.jit(lambda x: call(jax.lax.with_sharding_constraint(x, spec)))(x)
  np.testing.assert_array_equal(np.asarray(got),
                                layouts.compute("halo", ["0n"], ["0n"], x, lo=1, hi=1)[0])


def test_a_merge_closing_over_a_traced_value_is_refused_naming_it(partitioner, mesh8):
  sizes = _sizes()

  def f(x, scale):
    merge = bp.Combiner(lambda a, b: (a[0] + b[0] * scale,))
    return layouts.ffi_call("sum", ["0n"], ["0"], sizes, reduce={"n": merge})(x)

  with pytest.raises(ValueError, match=r"'batchpart_test_layout': reduce Combiner\(.*\) over "
                                       r"the dim n: the Combiner's merge closes over 1 "
                                       r"traced value\(s\) \(float32\[\]\)"):
    jax.jit(f)(np.zeros((4, 16), np.float32), jnp.float32(2))


def test_an_exported_combiner_not_carried_nor_declared_here_raises_value_error(
    partitioner, mesh8, monkeypatch):
  from jax import export

  sizes = _sizes()
  merge = bp.Combiner(lambda a, b: (a[0] + b[0],))
  x = put(_data(["0n"], sizes)[0], mesh8, P(None, "x"))
  # An artifact without its merge, as a batchpart that did not carry it wrote it.
  monkeypatch.setattr(partition_export, "carried_functions", lambda ctx, d: {})
  exported = export.export(
      jax.jit(layouts.ffi_call("sum", ["0n"], ["0"], sizes, reduce={"n": merge})),
      disabled_checks=[export.DisabledSafetyCheck.custom_call(layouts.TARGET)])(x)
  loaded = export.deserialize(exported.serialize())
  # A process that never declared it.
  monkeypatch.setattr(user_combiner.COMBINERS, "_by_name", {})
  with pytest.raises(ValueError, match="the call to 'batchpart_test_layout' merges its parts "
                                       "with the Combiner 'merge_[0-9a-f]+', which this "
                                       "process has not declared and the program does not "
                                       "carry"):
    jax.jit(loaded.call)(x)


def test_a_decorated_top_k_finds_k_by_its_size(partitioner, mesh2x4):
  """The decorator reads the call's k as the one result core dim of a size
  no operand core dim has; here k comes before another core dim."""
  sizes = _sizes(**{"0": 2, "n": 48, "k": 3, "j": 4})
  types = layouts.result_types("max_k", ["0kj", "0kj"], sizes)

  @bp.batch_partitionable(signature="(n,j)->(k,j),(k,j)", reduce={"n": "max_k"})
  def top_k(x):
    return jax.ffi.ffi_call(layouts.TARGET, types)(
        x, op=np.int64(layouts.OPS["max_k"]), roles="0nj;0kj;0kj", lo=np.int64(0),
        hi=np.int64(0))

  (x,) = _data(["0nj"], sizes)
  xs = put(x, mesh2x4, P("a", "b"))
  got = jax.jit(top_k)(xs)
  for g, w in zip(got, layouts.compute("max_k", ["0nj"], ["0kj", "0kj"], x, k=3)):
    np.testing.assert_array_equal(np.asarray(g), w)
  (call,) = bp.explain(top_k, xs).calls
  assert call.device_operand_shapes[0] == (1, 12, 4)
