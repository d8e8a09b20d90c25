"""bp.ffi_lowering and bp.partition_primitive on one device: retargeting,
argument checks, idempotence; jax's configuration tools with batchpart
imported."""

import os
import re
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest
from jax.interpreters import mlir

import batchpart as bp
from batchpart import _compat as compat, testing as kernels


def _softmax_primitive(name, rule=None):
  """A package-style primitive: its own abstract eval and lowering rule."""
  p = compat.Primitive(name)
  p.multiple_results = True
  p.def_abstract_eval(lambda x: (compat.ShapedArray(x.shape, x.dtype),
                                 compat.ShapedArray(x.shape[:-1], x.dtype)))
  p.def_impl(lambda x: jax.jit(p.bind)(x))
  mlir.register_lowering(p, rule or jax.ffi.ffi_lowering("batchpart_test_softmax"),
                         platform="cpu")
  return p


def _targets(text):
  """The derived names of a one-device lowering's batchpart calls: there the
  call keeps the user's target and carries its derived name as a frontend
  attribute (only calls XLA partitions are emitted under derived names)."""
  return re.findall(r'batchpart.derived_name = "([^"]+)"', text)


def test_ffi_lowering_emits_a_derived_call():
  p = _softmax_primitive("adopt_softmax_1",
                         bp.ffi_lowering("batchpart_test_softmax", num_batch_dims=1))
  x = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)
  text = jax.jit(p.bind).lower(x).as_text()
  assert _targets(text) == ["batchpart_test_softmax$bp1$o1$r1,1$no2$nr2,1"]
  assert "custom_call @batchpart_test_softmax(" in text
  assert 'num_batch_dims = "1"' in text
  np.testing.assert_allclose(jax.jit(p.bind)(x)[0], kernels.softmax_reference(x)[0],
                             rtol=1e-5)


def test_partition_primitive_with_a_signature_and_a_callable():
  p = _softmax_primitive("adopt_softmax_2")
  assert bp.partition_primitive(p, signature="(n)->(n),()") is p
  bp.partition_primitive(p, signature="(n)->(n),()")   # idempotent
  x = np.ones((2, 3, 5), np.float32)
  assert _targets(jax.jit(p.bind).lower(x).as_text()) == [
      "batchpart_test_softmax$bp1$o2$r2,2$no3$nr3,2"]
  q = _softmax_primitive("adopt_softmax_3")
  bp.partition_primitive(q, num_batch_dims=lambda ops, res: len(ops[0]) - 1)
  assert _targets(jax.jit(q.bind).lower(x).as_text()) == [
      "batchpart_test_softmax$bp1$o2$r2,2$no3$nr3,2"]


def test_rewrapping_with_other_arguments_names_the_primitive():
  p = _softmax_primitive("adopt_softmax_4")
  bp.partition_primitive(p, num_batch_dims=1)
  with pytest.raises(ValueError, match="adopt_softmax_4"):
    bp.partition_primitive(p, num_batch_dims=2)


@pytest.mark.parametrize("kwargs, error", [
    ({}, "exactly one of"),
    ({"num_batch_dims": 1, "signature": "(n)->(n),()"}, "exactly one of"),
    ({"num_batch_dims": -1}, "non-negative"),
    ({"num_batch_dims": 1, "shard_attributes": 3}, "shard_attributes"),
    ({"signature": "n->n"}, "gufunc signature"),
])
def test_bad_arguments_name_the_primitive(kwargs, error):
  p = _softmax_primitive(f"adopt_bad_{abs(hash(str(kwargs)))}")
  with pytest.raises((ValueError, TypeError), match=error):
    bp.partition_primitive(p, **kwargs)


def test_primitive_without_lowering_is_refused():
  p = compat.Primitive("adopt_no_lowering")
  with pytest.raises(ValueError, match="adopt_no_lowering.*no lowering rule"):
    bp.partition_primitive(p, num_batch_dims=1)


def test_a_rule_gets_core_sizes_through_a_third_parameter_without_default():
  from batchpart._partition.attributes import takes_core_sizes
  assert takes_core_sizes(lambda attrs, batch, core: {})
  assert takes_core_sizes(lambda *args: {})
  assert not takes_core_sizes(lambda attrs, batch: {})
  assert not takes_core_sizes(lambda attrs, batch, f=2.0: {})   # a value bound as a default


def test_num_batch_dims_beyond_the_calls_rank_names_the_target():
  p = _softmax_primitive("adopt_softmax_5")
  bp.partition_primitive(p, num_batch_dims=3)
  with pytest.raises(ValueError, match="adopt_softmax_5.*batchpart_test_softmax"):
    jax.jit(p.bind).lower(np.ones((4, 6), np.float32))


# Every tool jax's configuration supports, in a process that imported
# batchpart and declared a target (its declarations are part of jax's cache
# keys): absl flags from argv, JAX_* environment variables, config.update and
# the context managers.
_CONFIG_TOOLS = textwrap.dedent("""
    import sys
    from absl import flags
    import jax
    import jax.numpy as jnp
    import numpy as np
    import batchpart as bp
    from batchpart import testing as kernels

    kernels.register()
    bp.partition_ffi_target("batchpart_test_softmax", num_batch_dims=1)
    sys.argv = [sys.argv[0], "--jax_enable_x64=true", "--jax_numpy_rank_promotion=warn"]
    jax.config.parse_flags_with_absl()
    assert jax.config.jax_enable_x64 and jax.config.jax_numpy_rank_promotion == "warn"
    assert flags.FLAGS.jax_enable_x64 and flags.FLAGS.is_parsed()
    assert jax.config.jax_enable_checks   # JAX_ENABLE_CHECKS, below
    jax.config.update("jax_numpy_rank_promotion", "raise")
    with jax.numpy_rank_promotion("allow"):
      assert jax.config.jax_numpy_rank_promotion == "allow"
      assert jnp.add(jnp.ones(3), jnp.ones((2, 3))).shape == (2, 3)
    assert jax.config.jax_numpy_rank_promotion == "raise"
    x = np.ones((4, 6))
    y, _ = jax.jit(kernels.softmax)(x)
    assert y.dtype == np.float64
    print("ok")
""")


def test_jax_configuration_tools_work_with_batchpart_imported(tmp_path):
  script = tmp_path / "config_tools.py"
  script.write_text(_CONFIG_TOOLS)
  env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_"))}
  env["JAX_ENABLE_CHECKS"] = "1"
  out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                       text=True, timeout=240)
  assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]
