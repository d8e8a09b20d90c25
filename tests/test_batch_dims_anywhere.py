"""Batch dims anywhere on one device: the signature's '...', the batch spec,
the Shardy rule, the planner's relabeled view, vmap's layouts and values."""

import jax
import numpy as np
import pytest

import batchpart as bp
from batchpart import _core
from batchpart._frontend import signature
from batchpart._partition import plan, sharding_rule
from batchpart._primitive import batching
from batchpart._vocab.batch_spec import BatchSpec
from batchpart._vocab.description import CallDescription, default_layout
from batchpart._vocab.dims.batch import batch_first

CORE_SUM = "batchpart_test_core_sum"
S = jax.ShapeDtypeStruct
SIG = "(a,f,...,r),(f,...)->(p,f,...)"
ATTRS = {k: np.int64(v) for k, v in dict(x_lead=2, x_trail=1, y_lead=1, y_trail=0,
                                          out_lead=2, out_trail=0).items()}


def test_signature_spec():
  parsed = signature.parse_signature("(a,f,...,r),(a,f,...,r)->(p,f,...)", owner="t")
  assert parsed.spec() == BatchSpec((1, 1), (0,), (2, 2), (2,))
  # Without '...' the batch dims lead, as ever, and the spec has no leads.
  parsed = signature.parse_signature("(m,n),(n)->(m)", owner="t")
  assert parsed.spec() == BatchSpec((2, 1), (1,))
  assert parsed.spec().operand_lead_ranks == ()
  assert signature.parse_signature("(...,n)->(...)", owner="t").spec() == BatchSpec(
      (1,), (0,))


def test_spec_from_signature_binds_core_dims_on_both_sides():
  parsed = signature.parse_signature(SIG, owner="t")
  spec = signature.spec_from_signature("t", parsed, [(2, 3, 16, 4, 5), (3, 4)],
                                       [(2, 3, 16, 4)])
  assert spec == BatchSpec((1, 0), (0,), (2, 1), (2,))
  with pytest.raises(ValueError, match="core dim 'f' of operand 1"):
    signature.spec_from_signature("t", parsed, [(2, 3, 16, 4, 5), (2, 4)],
                                  [(2, 3, 16, 4)])
  with pytest.raises(ValueError, match="result 0 has shape"):
    signature.spec_from_signature("t", parsed, [(2, 3, 16, 4, 5), (3, 4)],
                                  [(2, 3, 4, 16)])


@pytest.mark.parametrize("bad", ["(...,...,n)->(n)", "(..)->()", "(a...)->()"])
def test_malformed_ellipsis_is_refused_by_name(bad):
  with pytest.raises(ValueError, match="batchpart.ffi_call\\('k'\\)"):
    bp.ffi_call("k", S((2,), np.float32), signature=bad)


def test_lead_ranks_all_zero_equal_none():
  assert BatchSpec((1,), (1,), (0,), (0,)) == BatchSpec((1,), (1,))
  assert BatchSpec((1,), (1,)).extra_params() == {}
  assert BatchSpec((1,), (1,), (2,), (0,)).extra_params() == {
      "operand_lead_ranks": (2,), "result_lead_ranks": (0,)}


def test_sharding_rule_puts_batch_factors_after_leading_core_dims():
  lhs, rhs, replicated, _ = sharding_rule.factors(
      [(2, 3, 16, 4, 5), (3, 4)], [1, 0], [(2, 3, 16, 4)], [0], (16, 4),
      operand_lead_ranks=(2, 1), result_lead_ranks=(2,))
  assert sharding_rule.text(lhs, rhs) == (
      "o0_0 o0_1 b0 b1 o0_4, o1_0 b1 -> o0_0 o0_1 b0 b1")
  # p and f of the result share x's a and f (same core position and size).
  assert replicated == ("o0_4", "o1_0")


def test_sharding_rule_without_leads_is_unchanged():
  args = ([(4, 1, 3, 5), (2, 5)], [2, 1], [(4, 2, 3)], [1], (4, 2))
  assert sharding_rule.factors(*args) == sharding_rule.factors(
      *args, operand_lead_ranks=(0, 0), result_lead_ranks=(0,))


def _tiled(tile_dims, devices, subgroups=()):
  s = _core.Sharding()
  s.kind = _core.Sharding.Kind.TILED
  s.tile_dims = list(tile_dims)
  s.subgroup_dims = [n for n, _ in subgroups]
  s.subgroup_kinds = [k for _, k in subgroups]
  s.devices = list(devices)
  return s


def test_permute_is_a_relabeling():
  devices = np.arange(8).reshape(2, 4)
  s = _tiled((2, 4, 1), devices.reshape(-1))
  perm = batch_first(3, 1, 1)                       # (c, b, n) -> (b, c, n)
  assert perm == [1, 0, 2]
  p = plan.permute(s, perm)
  assert list(p.tile_dims) == [4, 2, 1]
  assert list(p.devices) == list(devices.T.reshape(-1))
  back = plan.permute(p, [int(i) for i in np.argsort(perm)])
  assert list(back.tile_dims) == [2, 4, 1] and list(back.devices) == list(range(8))


def test_plan_of_batch_dims_after_a_core_dim():
  from jax._src.lib import xla_client
  # x (c=8, b=16, n=4) sharded 8 ways on c: the axis moves onto b.
  d = CallDescription("t", (1,), (1,), (default_layout(3),), (default_layout(2),),
                      operand_lead_ranks=(1,), result_lead_ranks=(0,))
  sharding = xla_client.HloSharding.iota_tile([8, 1, 1])
  p = plan.make_plan(d, [[8, 16, 4]], [sharding], [[16, 4]])
  assert [list(s) for s in p.operand_local_shapes] == [[8, 2, 4]]
  assert [list(s) for s in p.result_local_shapes] == [[2, 4]]
  assert list(p.operand_shardings[0].tile_dims) == [1, 8, 1]
  assert list(p.result_shardings[0].tile_dims) == [8, 1]


@pytest.mark.parametrize("layout, at, k, want", [
    ((2, 1, 0), 1, 1, (3, 2, 1, 0)),
    ((1, 0), 2, 1, (2, 1, 0)),
    ((2, 1, 0), 0, 2, (4, 3, 2, 1, 0)),
    ((0, 1, 2), 0, 1, (1, 2, 3, 0)),   # as before: a new leading dim is most major
    ((0, 1, 2), 1, 1, (0, 2, 1, 3)),   # just more major than the dim after it
])
def test_insert_layout(layout, at, k, want):
  assert batching._insert_layout(layout, at, k) == want


def _core_sum(x, y, out_shape, sig=SIG, attrs=ATTRS):
  return bp.ffi_call(CORE_SUM, S(out_shape, x.dtype), signature=sig)(x, y, **attrs)


def _reference(x, y):
  s = x.sum(axis=(0, 1, 4)) + y.sum(axis=0)
  return np.broadcast_to(s, (2, 3, *s.shape))


def test_values_and_derived_name_on_one_device():
  rng = np.random.default_rng(0)
  x = rng.standard_normal((2, 3, 6, 4, 5)).astype(np.float32)
  y = rng.standard_normal((3, 4)).astype(np.float32)
  f = jax.jit(lambda x, y: _core_sum(x, y, (2, 3, 6, 4)))
  np.testing.assert_allclose(f(x, y), _reference(x, y), rtol=1e-5, atol=1e-5)
  text = f.lower(x, y).as_text()
  assert "batchpart_test_core_sum$bp1$o2,1$r2$no5,2$nr4$po2,1$pr2" in text


@pytest.mark.parametrize("axis", [0, 1, 2, 3, 4, 5])
def test_vmap_puts_the_new_dim_at_the_ellipsis(axis):
  rng = np.random.default_rng(1)
  x = rng.standard_normal((2, 3, 6, 4, 5)).astype(np.float32)
  y = rng.standard_normal((3, 4)).astype(np.float32)
  xs = np.stack([x, -2 * x, 3 * x], axis=axis)
  f = jax.jit(jax.vmap(lambda x, y: _core_sum(x, y, (2, 3, 6, 4)), in_axes=(axis, None)))
  out = np.asarray(f(xs, y))
  assert out.shape == (3, 2, 3, 6, 4)
  for k, scale in enumerate((1, -2, 3)):
    np.testing.assert_allclose(out[k], _reference(scale * x, y), rtol=1e-4, atol=1e-4)
  # The mapped dim joins the batch dims: one call, batch rank 3.
  assert 'num_batch_dims = "3"' in f.lower(xs, y).as_text()


def test_vmap_of_both_operands_and_out_axes():
  rng = np.random.default_rng(2)
  x = rng.standard_normal((2, 3, 6, 4, 5)).astype(np.float32)
  y = rng.standard_normal((3, 4)).astype(np.float32)
  xs, ys = np.stack([x, 2 * x]), np.stack([y, -y], axis=-1)
  f = jax.vmap(lambda x, y: _core_sum(x, y, (2, 3, 6, 4)), in_axes=(0, 2), out_axes=3)
  out = np.asarray(jax.jit(f)(xs, ys))
  assert out.shape == (2, 3, 6, 2, 4)
  np.testing.assert_allclose(out[:, :, :, 1], _reference(2 * x, -y), rtol=1e-4, atol=1e-4)


def test_decorator_on_one_device():
  @bp.batch_partitionable(signature=SIG)
  def wrapper(x, y):
    return jax.ffi.ffi_call(CORE_SUM, S((2, 3, 6, 4), x.dtype))(x, y, **ATTRS)

  rng = np.random.default_rng(3)
  x = rng.standard_normal((2, 3, 6, 4, 5)).astype(np.float32)
  y = rng.standard_normal((3, 4)).astype(np.float32)
  np.testing.assert_allclose(jax.jit(wrapper)(x, y), _reference(x, y), rtol=1e-4,
                             atol=1e-4)
  text = jax.jit(wrapper).lower(x, y).as_text()
  assert "$po2,1$pr2" in text
