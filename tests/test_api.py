"""Single-device behaviour of the public API: values, registration,
decorator, lowering attributes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import batchpart as bp
from batchpart import _core, testing as kernels
from batchpart._partition import sharding_rule

rng = np.random.default_rng(0)


def test_public_names():
  assert set(bp.__all__) == {"register_ffi_target", "mark_batch_partitionable",
                             "is_batch_partitionable", "ffi_call", "batch_partitionable",
                             "explain", "linalg", "partition_primitive", "ffi_lowering",
                             "partition_ffi_target", "partition_callback", "unpartition",
                             "pure_callback", "io_callback", "buffer_callback", "Combiner",
                             "Halo", "Scan"}


def test_softmax_values_eager_and_jit():
  x = rng.standard_normal((5, 7)).astype(np.float32)
  for f in (kernels.softmax, jax.jit(kernels.softmax)):
    y, lse = f(x)
    ref_y, ref_lse = kernels.softmax_reference(x)
    np.testing.assert_allclose(y, ref_y, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-5, atol=1e-6)


def test_num_batch_dims_form():
  x = rng.standard_normal((2, 3, 7)).astype(np.float32)
  y, lse = bp.ffi_call("batchpart_test_softmax",
                       (jax.ShapeDtypeStruct(x.shape, x.dtype),
                        jax.ShapeDtypeStruct(x.shape[:-1], x.dtype)),
                       num_batch_dims=2)(x)
  np.testing.assert_allclose(y, kernels.softmax_reference(x)[0], rtol=1e-5, atol=1e-6)


def test_result_container_type_follows_result_shape_dtypes():
  x = np.ones((2, 3), np.float32)
  s = jax.ShapeDtypeStruct
  as_tuple = bp.ffi_call("batchpart_test_softmax", (s((2, 3), x.dtype), s((2,), x.dtype)),
                         signature="(n)->(n),()")(x)
  as_list = bp.ffi_call("batchpart_test_softmax", [s((2, 3), x.dtype), s((2,), x.dtype)],
                        signature="(n)->(n),()")(x)
  single = bp.ffi_call("batchpart_test_copy_bytes", s((1, 2, 3), x.dtype),
                       num_batch_dims=1)(x[None])
  assert isinstance(as_tuple, tuple) and isinstance(as_list, list)
  assert isinstance(single, jax.Array)


def test_float64_kernel_path():
  with jax.enable_x64(True):
    a = rng.standard_normal((3, 4, 5))
    v = rng.standard_normal((5,))
    y = kernels.matvec(jnp.asarray(a), jnp.asarray(v), alpha=-2.0)
    assert y.dtype == jnp.float64
    np.testing.assert_allclose(y, -2.0 * a @ v, rtol=1e-12)


def test_empty_batch():
  x = np.ones((0, 4), np.float32)
  y, lse = jax.jit(kernels.softmax)(x)
  assert y.shape == (0, 4) and lse.shape == (0,)


def test_registration_marks_batch_partitionable():
  assert bp.is_batch_partitionable("batchpart_test_softmax")
  assert not bp.is_batch_partitionable("never_registered_target")
  jax.ffi.register_ffi_target("api_test_marked_later", _core.testing.handlers()["softmax"])
  assert not bp.is_batch_partitionable("api_test_marked_later")
  bp.mark_batch_partitionable("api_test_marked_later")
  bp.mark_batch_partitionable("api_test_marked_later")  # idempotent
  assert bp.is_batch_partitionable("api_test_marked_later")


def test_lowering_carries_frontend_attribute_and_sharding_rule():
  x = np.ones((4, 3, 8), np.float32)
  text = jax.jit(kernels.softmax).lower(x).as_text()
  assert 'num_batch_dims = "2"' in text
  # On one device XLA does not partition: the call keeps the user's target
  # and carries the derived name (batch ranks and ranks of the call) aside.
  assert "custom_call @batchpart_test_softmax(" in text
  assert 'batchpart.derived_name = "batchpart_test_softmax$bp1$o2$r2,2$no3$nr3,2"' in text
  assert "sdy.sharding_rule" not in text
  # batch dims share factors across operand and results; the result's core dim
  # shares the operand's (same size): a core-sharded input keeps its layout
  lhs, rhs, replicated, _ = sharding_rule.factors([(4, 3, 8)], [1], [(4, 3, 8), (4, 3)],
                                               [1, 0], (4, 3))
  assert sharding_rule.text(lhs, rhs) == "b0 b1 o0_2 -> b0 b1 o0_2, b0 b1"
  assert replicated == ()


def test_gspmd_lowering_has_no_sharding_rule():
  x = np.ones((4, 8), np.float32)
  with jax.config.update("jax_use_shardy_partitioner", False) or _restore_shardy():
    text = jax.jit(kernels.softmax).lower(x).as_text()
  assert "sdy.sharding_rule" not in text
  assert 'num_batch_dims = "1"' in text


class _restore_shardy:
  def __enter__(self):
    return self

  def __exit__(self, *exc):
    jax.config.update("jax_use_shardy_partitioner", True)


def test_broadcast_operand_rule_gives_size_one_dims_their_own_factor():
  a = np.ones((4, 1, 3, 5), np.float32)
  v = np.ones((2, 5), np.float32)
  text = jax.jit(kernels.matvec).lower(a, v).as_text()
  assert 'num_batch_dims = "2"' in text
  lhs, rhs, replicated, _ = sharding_rule.factors([(4, 1, 3, 5), (2, 5)], [2, 1],
                                               [(4, 2, 3)], [1], (4, 2))
  # the size-1 batch dim of a is a factor of its own that needs replication;
  # the result's core dim shares a's (same size)
  assert sharding_rule.text(lhs, rhs) == "b0 o0_1 o0_2 o0_3, b1 o1_1 -> b0 b1 o0_2"
  assert replicated == ("o0_1", "o0_3", "o1_1")


def test_decorator_single_device_values_and_kwargs():
  jax.ffi.register_ffi_target("api_test_plain_matvec", _core.testing.handlers()["matvec"])

  @bp.batch_partitionable(signature="(m,n),(n)->(m)")
  def scaled_matvec(a, v, *, alpha):
    y = jax.ffi.ffi_call("api_test_plain_matvec",
                         jax.ShapeDtypeStruct(a.shape[:-1], a.dtype))(a, v, alpha=alpha)
    return jnp.tanh(y)

  a = rng.standard_normal((6, 3, 4)).astype(np.float32)
  v = rng.standard_normal((6, 4)).astype(np.float32)
  out = jax.jit(lambda a, v: scaled_matvec(a, v, alpha=np.float64(0.5)))(a, v)
  np.testing.assert_allclose(out, np.tanh(0.5 * np.einsum("bij,bj->bi", a, v)),
                             rtol=1e-5, atol=1e-6)
  jaxpr = jax.make_jaxpr(lambda a, v: scaled_matvec(a, v, alpha=np.float64(0.5)))(a, v)
  assert "batchpart_ffi_call" in str(jaxpr) and " ffi_call[" not in str(jaxpr)
  assert bp.is_batch_partitionable("api_test_plain_matvec")


def test_decorator_reaches_into_nested_jit():
  jax.ffi.register_ffi_target("api_test_plain_softmax", _core.testing.handlers()["softmax"])

  @jax.jit
  def inner(x):
    return jax.ffi.ffi_call("api_test_plain_softmax",
                            (jax.ShapeDtypeStruct(x.shape, x.dtype),
                             jax.ShapeDtypeStruct(x.shape[:-1], x.dtype)))(x)[0]

  wrapped = bp.batch_partitionable(inner, num_batch_dims=1)
  x = rng.standard_normal((4, 6)).astype(np.float32)
  assert "batchpart_ffi_call" in str(jax.make_jaxpr(wrapped)(x))
  np.testing.assert_allclose(wrapped(x), kernels.softmax_reference(x)[0], rtol=1e-5,
                             atol=1e-6)


def test_not_differentiable_message():
  x = np.ones((2, 3), np.float32)
  with pytest.raises(ValueError, match="batchpart_test_softmax.*cannot be differentiated"):
    jax.grad(lambda x: kernels.softmax(x)[1].sum())(x)


def test_copy_bytes_on_packed_sub_byte_types():
  """int4 is stored two per byte: the kernel copies the packed storage."""
  x = (np.arange(8 * 4 * 6) % 15 - 7).reshape(8, 4, 6)
  for dtype in (jnp.int4, jnp.uint4):
    a = jnp.asarray(x % 8 if dtype == jnp.uint4 else x, dtype)
    out = bp.ffi_call("batchpart_test_copy_bytes", jax.ShapeDtypeStruct(a.shape, dtype),
                      signature="(m,n)->(m,n)")(a)
    np.testing.assert_array_equal(np.asarray(out, np.int32), np.asarray(a, np.int32))


def test_ffi_call_accepts_jax_ffi_call_keywords():
  x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
  f = bp.ffi_call("batchpart_test_softmax", (jax.ShapeDtypeStruct(x.shape, x.dtype),
                                             jax.ShapeDtypeStruct(x.shape[:-1], x.dtype)),
                  signature="(n)->(n),()", vmap_method="broadcast_all",
                  custom_call_api_version=4, legacy_backend_config=None)
  np.testing.assert_allclose(f(x)[0], kernels.softmax_reference(x)[0], rtol=1e-5)


@pytest.fixture
def plugin_platform(monkeypatch):
  """A started backend for "CUDA" as a PJRT plugin has one: registrations go
  to its handler (into the plugin's own registry, which jaxlib's
  ``custom_call_targets`` cannot read) instead of jax's queue."""
  from jax._src.lib import xla_client
  received = []
  handlers = dict(xla_client._custom_callback_handler)
  handlers["CUDA"] = lambda name, fn, platform, api_version, traits: received.append(name)
  monkeypatch.setattr(xla_client, "_custom_callback_handler", handlers)
  queue = dict(xla_client._custom_callback)
  queue.pop("CUDA", None)
  monkeypatch.setattr(xla_client, "_custom_callback", queue)
  return received


def test_calls_lower_for_a_plugin_platform_whose_registry_cannot_be_read(plugin_platform):
  capsule = _core.testing.handlers()["softmax"]
  S = jax.ShapeDtypeStruct
  x = np.ones((4, 8), np.float32)
  # registered through batchpart: known to be a typed-FFI handler
  bp.register_ffi_target("api_test_plugin_bp", capsule, platform="CUDA")
  # registered through jax, after the plugin started: batchpart cannot see it,
  # lets the call through, and XLA's compile would name a missing handler
  jax.ffi.register_ffi_target("api_test_plugin_jax", capsule, platform="CUDA")
  assert plugin_platform == ["api_test_plugin_bp", "api_test_plugin_jax"]
  for name in plugin_platform:
    call = bp.ffi_call(name, (S((4, 8), np.float32), S((4,), np.float32)), num_batch_dims=1)
    text = jax.jit(call).trace(x).lower(lowering_platforms=("cuda",)).as_text()
    assert f"custom_call @{name}(" in text
  bp.mark_batch_partitionable("api_test_plugin_jax")
  # a legacy registration batchpart made is still refused by name
  bp.register_ffi_target("api_test_plugin_legacy", capsule, platform="CUDA", api_version=0)
  legacy = bp.ffi_call("api_test_plugin_legacy", S((4,), np.float32), num_batch_dims=1)
  with pytest.raises(ValueError, match="api_test_plugin_legacy.*legacy custom-call API"):
    jax.jit(legacy).trace(x).lower(lowering_platforms=("cuda",))
