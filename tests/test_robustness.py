"""One-device guards for the defect classes of docs/reliability.md: legacy
targets, stateful handler bundles, calls with no results, serialized
executables in a fresh process, rule identity, and argument checks."""

import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest
from jax.interpreters import mlir

import batchpart as bp
from batchpart import _compat as compat, _core, testing as kernels
from batchpart._partition import rule_digest

f32 = np.float32


def _legacy_target(name):
  # Any function pointer will do: a legacy target that is never called.
  jax.ffi.register_ffi_target(name, _core.testing.handlers()["softmax"], platform="cpu",
                              api_version=0)


def test_ffi_call_to_a_legacy_target_raises_naming_it():
  _legacy_target("robust_legacy_1")
  x = np.ones((4, 3), f32)
  f = bp.ffi_call("robust_legacy_1", jax.ShapeDtypeStruct(x.shape, x.dtype),
                  num_batch_dims=1)
  with pytest.raises(ValueError, match="robust_legacy_1.*legacy custom-call API"):
    jax.jit(f).lower(x)


def test_mark_batch_partitionable_refuses_a_legacy_target():
  _legacy_target("robust_legacy_2")
  jax.jit(lambda x: x + 1)(1.0)   # starts the backend: the target is registered
  with pytest.raises(ValueError, match="robust_legacy_2.*legacy custom-call API"):
    bp.mark_batch_partitionable("robust_legacy_2")


def test_stateful_bundle_keeps_its_instantiate_stage_on_one_device():
  kernels.register_stateful()
  x = np.arange(12, dtype=f32).reshape(4, 3)
  np.testing.assert_array_equal(jax.jit(lambda x: kernels.stateful(x, 1.5))(x), x + 1.5)
  # vmapped too: still one call, the user's target
  text = jax.jit(jax.vmap(lambda x: kernels.stateful(x, 1.5))).lower(x[None]).as_text()
  assert "custom_call @batchpart_test_stateful(" in text


def test_a_call_with_no_results_runs_once_on_one_device():
  x = np.arange(12, dtype=f32).reshape(4, 3)
  kernels.reset_batch_elements_processed()
  jax.jit(kernels.count)(x)
  jax.effects_barrier()
  assert kernels.batch_elements_processed() == 4
  assert kernels.counted_sum() == x.sum()


def test_zero_result_signature_parses():
  with pytest.raises(ValueError, match="names 1 results but result_shape_dtypes has 0"):
    bp.ffi_call("batchpart_test_count", [], signature="(n)->(n)")(np.ones((2, 3), f32))
  bp.ffi_call("batchpart_test_count", [], signature="(n)->", has_side_effect=True)


@pytest.mark.parametrize("k", [np.int64(1), np.int32(1)])
def test_num_batch_dims_takes_numpy_integers(k):
  x = np.random.default_rng(0).standard_normal((4, 6)).astype(f32)
  y, _ = bp.ffi_call("batchpart_test_softmax",
                     (jax.ShapeDtypeStruct(x.shape, f32), jax.ShapeDtypeStruct((4,), f32)),
                     num_batch_dims=k)(x)
  np.testing.assert_allclose(y, kernels.softmax_reference(x)[0], rtol=1e-5)


def test_a_target_name_that_is_not_a_string_is_a_type_error():
  with pytest.raises(TypeError, match="target_name must be a non-empty str, got 123"):
    bp.ffi_call(123, jax.ShapeDtypeStruct((2,), f32), num_batch_dims=1)


def _primitive(name, lowering):
  p = compat.Primitive(name)
  p.def_abstract_eval(lambda x, y, **_: compat.ShapedArray(x.shape, x.dtype))
  mlir.register_lowering(p, lowering)
  return p


def _factor_rule(factor):
  return lambda attrs, batch: {"alpha": np.float64(factor)}


def test_repartitioning_with_another_closure_of_one_factory_raises():
  p = _primitive("robust_axpy_1", jax.ffi.ffi_lowering("batchpart_test_axpy"))
  bp.partition_primitive(p, num_batch_dims=1, shard_attributes=_factor_rule(2.0))
  bp.partition_primitive(p, num_batch_dims=1, shard_attributes=_factor_rule(2.0))  # same
  with pytest.raises(ValueError, match="robust_axpy_1.*already partitioned"):
    bp.partition_primitive(p, num_batch_dims=1, shard_attributes=_factor_rule(3.0))


def test_errors_of_partition_primitive_name_it_and_the_operand():
  p = _primitive("robust_axpy_2", jax.ffi.ffi_lowering("batchpart_test_axpy"))
  bp.partition_primitive(p, num_batch_dims=1)
  x, y = np.ones((4, 3), f32), np.ones((5, 3), f32)
  with pytest.raises(ValueError, match=r"partition_primitive\('robust_axpy_2'\).*"
                     r"batchpart_test_axpy.*operand 1 has shape \(5, 3\)"):
    jax.jit(lambda x, y: p.bind(x, y, alpha=1.0)).lower(x, y)


def test_rule_digests_follow_what_the_rule_computes():
  digest = lambda fn: rule_digest.digest(fn, owner="test")
  assert digest(_factor_rule(2.0)) == digest(_factor_rule(2.0))
  assert digest(_factor_rule(2.0)) != digest(_factor_rule(3.0))
  assert digest(lambda a, b, k=1: {}) != digest(lambda a, b, k=2: {})
  assert digest(np.add) == digest(np.add)
  table = np.arange(3)
  with_table = lambda a, b: {"alpha": table[0]}
  before = digest(with_table)
  table[0] = 7   # a captured array is digested by content
  assert digest(with_table) != before


def test_an_undigestable_rule_raises_and_a_key_opts_out():
  lock = __import__("threading").Lock()
  rule = lambda a, b: {"alpha": 1.0 if lock else 2.0}
  with pytest.raises(TypeError, match="owner.*__batchpart_key__"):
    rule_digest.digest(rule, owner="owner")
  rule.__batchpart_key__ = "v1"
  assert rule_digest.digest(rule, owner="owner") == rule_digest.digest(rule, owner="owner")


LOAD_EXECUTABLE = textwrap.dedent("""
    import sys, pickle
    import jax, numpy as np
    from jax.experimental import serialize_executable
    from batchpart import _core   # the capsules only: nothing of batchpart runs
    jax.ffi.register_ffi_target("batchpart_test_softmax", _core.testing.handlers()["softmax"])
    payload, in_tree, out_tree = pickle.load(open(sys.argv[1], "rb"))
    compiled = serialize_executable.deserialize_and_load(payload, in_tree, out_tree)
    y, lse = compiled(np.load(sys.argv[2]))
    np.save(sys.argv[3], np.asarray(y))
""")


def test_a_serialized_one_device_executable_loads_in_a_fresh_process(tmp_path):
  import pickle

  from jax.experimental import serialize_executable
  x = np.random.default_rng(1).standard_normal((4, 6)).astype(f32)
  compiled = jax.jit(kernels.softmax).lower(x).compile()
  (tmp_path / "exe.pkl").write_bytes(pickle.dumps(serialize_executable.serialize(compiled)))
  np.save(tmp_path / "x.npy", x)
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  proc = subprocess.run([sys.executable, "-c", LOAD_EXECUTABLE, str(tmp_path / "exe.pkl"),
                         str(tmp_path / "x.npy"), str(tmp_path / "y.npy")],
                        capture_output=True, text=True, timeout=240, env=env)
  assert proc.returncode == 0, proc.stderr[-3000:]
  np.testing.assert_allclose(np.load(tmp_path / "y.npy"), kernels.softmax_reference(x)[0],
                             rtol=1e-5)


def test_missing_rule_message_names_the_declaring_calls():
  from batchpart._partition import attributes
  with pytest.raises(RuntimeError, match="some_target.*0123456789abcdef.*shard_attributes"):
    attributes.rule_for_digest("0123456789abcdef", target="some_target")
