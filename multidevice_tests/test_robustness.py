"""Guards for the defect classes of docs/reliability.md on 8 devices, under
Shardy and GSPMD: per-shard attribute rules identified by what they compute
(closures, same-named primitives, compile orders, the persistent cache),
stateful handler bundles, calls with no results, and export (jax's stable
targets, GSPMD artifacts called under Shardy, one-device artifacts called
sharded)."""

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from jax import export
from jax.interpreters import mlir
from jax.sharding import PartitionSpec as P

import batchpart as bp
from batchpart import _compat as compat, testing as kernels

from helpers import collective_kinds, local_shapes, put, run_sharing_a_cache, the_custom_call

f32 = np.float32
HERE = os.path.dirname(__file__)


def _factor_rule(factor):
  """A rule factory: every closure rewrites alpha to its own factor."""
  return lambda attrs, batch: {"alpha": np.float64(factor)}


def _axpy(name, rule, *, via="ffi_lowering"):
  """A package-style axpy primitive whose per-shard alpha comes from ``rule``."""
  p = compat.Primitive(name)
  p.def_abstract_eval(lambda x, y, **_: compat.ShapedArray(x.shape, x.dtype))
  if via == "ffi_lowering":
    mlir.register_lowering(p, bp.ffi_lowering("batchpart_test_axpy", num_batch_dims=1,
                                              shard_attributes=rule))
  else:
    mlir.register_lowering(p, jax.ffi.ffi_lowering("batchpart_test_axpy"))
    bp.partition_primitive(p, num_batch_dims=1, shard_attributes=rule)
  return p


def _run(p, mesh):
  x = np.arange(32, dtype=f32).reshape(16, 2)
  y = np.ones((16, 2), f32)
  f = jax.jit(lambda x, y: p.bind(x, y, alpha=np.float64(1.0)))
  return np.asarray(f(put(x, mesh, P("x")), put(y, mesh, P("x")))), x, y


@pytest.mark.timeout(120)
@pytest.mark.parametrize("order", ["define both, then compile", "compile between"])
def test_closures_of_one_factory_keep_their_own_values(partitioner, mesh8, order):
  tag = f"{partitioner}_{order[0]}"
  p2 = _axpy(f"robust_closure_2_{tag}", _factor_rule(2.0))
  if order == "compile between":
    out, x, y = _run(p2, mesh8)
    np.testing.assert_array_equal(out, 2 * x + y)
  p3 = _axpy(f"robust_closure_3_{tag}", _factor_rule(3.0))
  for p, factor in ((p2, 2.0), (p3, 3.0), (p2, 2.0)):
    out, x, y = _run(p, mesh8)
    np.testing.assert_array_equal(out, factor * x + y)


@pytest.mark.timeout(120)
def test_same_named_primitives_keep_their_own_rules(partitioner, mesh8):
  name = f"robust_same_name_{partitioner}"
  p2 = _axpy(name, _factor_rule(2.0), via="partition_primitive")
  p3 = _axpy(name, lambda attrs, batch: {"alpha": np.float64(3.0)},
             via="partition_primitive")
  for p, factor in ((p2, 2.0), (p3, 3.0)):
    out, x, y = _run(p, mesh8)
    np.testing.assert_array_equal(out, factor * x + y)


_DEFAULT_FACTOR = 5.0


def _rule_by_kind(kind: str, factor: float):
  """Rules that differ in each way a rule can: closure values, defaults,
  argument-free lambdas, partials."""
  import functools
  if kind == "closure":
    return _factor_rule(factor)
  if kind == "default":
    return lambda attrs, batch, f=factor: {"alpha": np.float64(f)}
  if kind == "partial":
    return functools.partial(lambda f, attrs, batch: {"alpha": np.float64(f)}, factor)
  return lambda attrs, batch: {"alpha": np.float64(_DEFAULT_FACTOR)}   # a global


_counter = iter(range(10**9))


@pytest.mark.timeout(900)
@settings(max_examples=300, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_drawn_rules_and_compile_orders_give_no_wrong_value(data, mesh8):
  """Rules (closures, defaults, partials, globals) on primitives that may
  share a name, declared and compiled in drawn interleavings: every program
  computes with its own rule."""
  shardy = data.draw(st.booleans(), label="shardy")
  jax.config.update("jax_use_shardy_partitioner", shardy)
  try:
    n = data.draw(st.integers(1, 3), label="primitives")
    name = f"robust_drawn_{next(_counter)}"
    declared = []   # (primitive, factor)
    steps = data.draw(st.permutations(
        [("declare", i) for i in range(n)] + [("run", i) for i in range(n)]), label="order")
    pending = {}
    for action, i in steps:
      if action == "declare":
        kind = data.draw(st.sampled_from(["closure", "default", "partial", "global"]))
        factor = data.draw(st.sampled_from([2.0, 3.0, 4.0]))
        shared_name = data.draw(st.booleans())
        via = data.draw(st.sampled_from(["ffi_lowering", "partition_primitive"]))
        p = _axpy(name if shared_name else f"{name}_{i}", _rule_by_kind(kind, factor),
                  via=via)
        pending[i] = (p, _DEFAULT_FACTOR if kind == "global" else factor)
        declared.append(pending[i])
      elif i in pending:
        p, factor = pending[i]
        out, x, y = _run(p, mesh8)
        np.testing.assert_array_equal(out, factor * x + y)
    for p, factor in declared:   # every one again, after all were declared
      out, x, y = _run(p, mesh8)
      np.testing.assert_array_equal(out, factor * x + y)
  finally:
    jax.config.update("jax_use_shardy_partitioner", True)


PERSISTENT_CACHE = textwrap.dedent("""
    factor = float(sys.argv[2])   # what this "version" of the rule computes
    p = compat.Primitive("persistent_axpy")
    p.def_abstract_eval(lambda x, y, **_: compat.ShapedArray(x.shape, x.dtype))
    mlir.register_lowering(p, bp.ffi_lowering(
        "batchpart_test_axpy", num_batch_dims=1,
        shard_attributes=lambda attrs, batch: {"alpha": np.float64(factor)}))
    mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))
    s = NamedSharding(mesh, P("x"))
    x = jax.device_put(np.arange(16, dtype=np.float32).reshape(8, 2), s)
    y = jax.device_put(np.ones((8, 2), np.float32), s)
    out = jax.jit(lambda x, y: p.bind(x, y, alpha=np.float64(1.0)))(x, y)
    np.testing.assert_array_equal(np.asarray(out), factor * np.asarray(x) + 1)
    print("ok", factor)
""")


@pytest.mark.timeout(300)
def test_the_persistent_cache_sees_a_changed_rule(tmp_path):
  # The last run reads back what the first wrote.
  run_sharing_a_cache(PERSISTENT_CACHE, tmp_path, ("2.0", "3.0", "2.0"))


@pytest.mark.timeout(120)
def test_a_stateful_bundle_runs_sharded(partitioner, mesh8):
  kernels.register_stateful()
  x = np.arange(64, dtype=f32).reshape(16, 4)
  f = jax.jit(lambda x: kernels.stateful(x, 2.5))
  xs = put(x, mesh8, P("x"))
  np.testing.assert_array_equal(f(xs), x + 2.5)
  call = the_custom_call(f.lower(xs).compile().as_text(), kernels.STATEFUL)
  assert local_shapes(call) == [(2, 4)]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("spec", [P("x"), P(None, "x")])
def test_a_call_with_no_results_runs_each_row_once(partitioner, mesh8, spec):
  x = np.random.default_rng(0).standard_normal((16, 8)).astype(f32)
  f = jax.jit(kernels.count)
  xs = put(x, mesh8, spec)
  kernels.reset_batch_elements_processed()
  f(xs)
  jax.effects_barrier()
  assert kernels.batch_elements_processed() == 16
  np.testing.assert_allclose(kernels.counted_sum(), x.sum(), rtol=1e-4)
  text = f.lower(xs).compile().as_text()
  assert local_shapes(the_custom_call(text, "batchpart_test_count")) == [(2, 8)]


EXPORT_JAX_PRIMITIVE = textwrap.dedent("""
    import jax, numpy as np
    jax.config.update("jax_num_cpu_devices", 8)
    import jax.numpy as jnp
    from jax import export
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
    import batchpart as bp
    bp.partition_primitive(jax.lax.linalg.cholesky_p, signature="(n,n)->(n,n),()")
    mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))
    s = NamedSharding(mesh, P("x"))
    a = np.eye(4, dtype=np.float32)[None].repeat(16, 0) * 4
    for shape_dtype in (jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        jax.ShapeDtypeStruct(a.shape, a.dtype)):
      exp = export.export(jax.jit(jnp.linalg.cholesky))(shape_dtype)   # no disabled check
      out = exp.call(jax.device_put(a, s))
      np.testing.assert_allclose(np.asarray(out), np.linalg.cholesky(a), rtol=1e-6)
    print("ok")
""")


@pytest.mark.timeout(300)
def test_export_after_partition_primitive_on_a_jaxlib_primitive():
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  proc = subprocess.run([sys.executable, "-c", EXPORT_JAX_PRIMITIVE], capture_output=True,
                        text=True, timeout=240, env=env)
  assert proc.returncode == 0, proc.stderr[-3000:]


def _export_softmax(sharding):
  x = jax.ShapeDtypeStruct((64, 16), f32, sharding=sharding)
  return export.export(jax.jit(kernels.softmax), disabled_checks=[
      export.DisabledSafetyCheck.custom_call("batchpart_test_softmax")])(x)


@pytest.mark.timeout(120)
def test_a_gspmd_artifact_called_under_shardy_stays_partitioned(mesh8):
  jax.config.update("jax_use_shardy_partitioner", False)
  try:
    exported = _export_softmax(jax.sharding.NamedSharding(mesh8, P("x")))
  finally:
    jax.config.update("jax_use_shardy_partitioner", True)
  assert "sdy.sharding_rule" not in exported.mlir_module()
  x = np.random.default_rng(3).standard_normal((64, 16)).astype(f32)
  f = jax.jit(exported.call)
  xs = put(x, mesh8, P("x"))
  text = f.lower(xs).compile().as_text()
  assert collective_kinds(text) == set()
  assert local_shapes(the_custom_call(text, "batchpart_test_softmax")) == [(8, 16)]
  np.testing.assert_allclose(f(xs)[0], kernels.softmax_reference(x)[0], rtol=1e-5)


@pytest.mark.timeout(120)
def test_a_one_device_artifact_called_sharded_is_partitioned(partitioner, mesh8):
  exported = _export_softmax(None)
  assert "custom_call @batchpart_test_softmax(" in exported.mlir_module()
  x = np.random.default_rng(4).standard_normal((64, 16)).astype(f32)
  xs = put(x, mesh8, P("x"))
  f = jax.jit(exported.call)
  text = f.lower(xs).compile().as_text()
  assert local_shapes(the_custom_call(text, "batchpart_test_softmax")) == [(8, 16)]
  assert "all-gather" not in collective_kinds(text)
  np.testing.assert_allclose(f(xs)[0], kernels.softmax_reference(x)[0], rtol=1e-5)


@pytest.mark.timeout(120)
def test_jnp_results_unaffected(mesh8):
  """The plain jnp program around these calls stays what it was."""
  x = put(np.ones((16, 4), f32), mesh8, P("x"))
  np.testing.assert_array_equal(jax.jit(lambda x: jnp.sum(x, axis=1))(x), np.full(16, 4.0))
