"""Halo dims on one device: ``halo={"n": w}`` / ``halo={"n": bp.Halo(lo, hi)}``.

Bad declarations are refused where the call is declared, naming the target
or callback and the dim; the derived name carries the halo and reads back;
the Shardy rule shares a halo dim's factor between operands and results; on
one device nothing is split, so the values are the kernel's own.
"""

import re

import jax
import numpy as np
import pytest

import batchpart as bp
from batchpart import _compat as compat
from batchpart._partition import sharding_rule
from batchpart._partition.plan import make_plan
from batchpart._vocab import derived_names
from batchpart._vocab.description import CallDescription
from batchpart._vocab.dims.halo import HaloDim, splits_into

S = jax.ShapeDtypeStruct
STENCIL = "batchpart_test_stencil"
OWNER = re.escape(f"batchpart.ffi_call('{STENCIL}')")


def stencil(shape, halo, signature="(n)->(n)", dtype=np.float32):
  return bp.ffi_call(STENCIL, S(shape, dtype), signature=signature, halo=halo)


def test_halo_is_exported_with_its_fields():
  h = bp.Halo(1, 2, periodic=True)
  assert (h.lo, h.hi, h.periodic, h.width) == (1, 2, True, 3)
  assert bp.Halo(1, 2) == bp.Halo(np.int64(1), 2, False)
  assert "Halo" in bp.__all__


@pytest.mark.parametrize("kwargs, message", [
    (dict(halo={"n": -1}), r"halo dim 'n' has a negative width \(lo=-1, hi=-1\)"),
    (dict(halo={"n": bp.Halo(0, -2)}), r"halo dim 'n' has a negative width \(lo=0, hi=-2\)"),
    (dict(signature="(n)->()", halo={"n": 1}),
     r"halo names the dim 'n', which is missing from result 0"),
    (dict(signature="(n)->(n)", halo={"m": 1}),
     r"halo names the dim 'm', which is not a core dim of any operand"),
    (dict(signature="(n,n)->(n,n)", halo={"n": 1}),
     r"halo names the dim 'n', which appears twice in one array"),
    (dict(signature="(n,m)->(m)", halo={"n": 1}, reduce={"n": "sum"}),
     r"halo names the dim 'n', which is also reduced"),
    (dict(num_batch_dims=1, halo={"n": 1}),
     r"halo=\{'n': 1\} names core dims, which only a signature declares"),
])
def test_bad_halo_declarations_name_the_target_and_the_dim(kwargs, message):
  kwargs.setdefault("signature", "(n)->(n)")
  if "num_batch_dims" in kwargs:
    del kwargs["signature"]
  with pytest.raises(ValueError, match=OWNER + ".*" + message):
    bp.ffi_call(STENCIL, S((8,), np.float32), **kwargs)


@pytest.mark.parametrize("halo", [{"n": 1.5}, {"n": True}, {"n": "1"}, [("n", 1)]])
def test_halo_of_the_wrong_type_is_refused(halo):
  with pytest.raises(TypeError, match=OWNER):
    stencil((8,), halo)


def test_a_halo_dim_of_another_size_in_a_result_is_refused():
  with pytest.raises(ValueError, match=OWNER + r".*core dim 'n' of result 0"):
    stencil((9,), {"n": 1})(np.zeros(8, np.float32), rank=np.int64(1), lo=np.int64(1),
                            hi=np.int64(1), mode=np.int64(0))


def test_bad_halo_through_the_other_entry_points():
  owner = r"batchpart\.partition_ffi_target\('t'\)"
  with pytest.raises(ValueError, match=owner + r".*halo names the dim 'n', which is missing"):
    bp.partition_ffi_target("t", signature="(n)->()", halo={"n": 1})
  with pytest.raises(ValueError, match=r"halo dim 'n' has a negative width"):
    bp.ffi_lowering("t", signature="(n)->(n)", halo={"n": -1})
  with pytest.raises(ValueError, match=r"pure_callback\(.*<lambda>\).*halo names the dim 'n', "
                                       r"which is missing from result 0"):
    bp.pure_callback(lambda x: x, S((), np.float32), np.zeros(8, np.float32),
                     signature="(n)->()", halo={"n": 1})
  with pytest.raises(ValueError, match=r"io_callback\(.*<lambda>\).*halo="):
    bp.io_callback(lambda x: x, S((8,), np.float32), np.zeros(8, np.float32),
                   signature="(n)->(n)", halo={"n": 1})


def test_splits_into_needs_even_parts_no_shorter_than_the_window():
  h = HaloDim("n", 1, 2, False, ((0, -1),), ((0, -1),))
  assert splits_into(h, 12, 1) and splits_into(h, 12, 4) and splits_into(h, 7, 1)
  assert not splits_into(h, 12, 5)     # uneven
  assert not splits_into(h, 8, 4)      # parts of 2 < lo + hi
  assert splits_into(h, 12, 4)


def _description(periodic=True, ends="wrap", cval=0.0):
  halo = HaloDim("n", 1, 2, periodic, ((0, -1), (1, 0)), ((0, -1),), ends, cval)
  return CallDescription(
      target="t", operand_batch_ranks=(1, 1), result_batch_ranks=(1,),
      operand_layouts=((1, 0), (2, 1, 0)), result_layouts=((1, 0),),
      operand_lead_ranks=(0, 1), halos=(halo,))


def test_the_derived_name_carries_the_halo_and_reads_back():
  d = _description()
  name = derived_names.encode(d)
  assert "$h:n=1.2.p:0.-1,1.0:0.-1" in name
  assert derived_names.decode(name) == d


@pytest.mark.parametrize("ends, cval, field", [
    (None, 0.0, "1.2:"), ("nearest", 0.0, "1.2.nearest:"), ("reflect", 0.0, "1.2.reflect:"),
    ("mirror", 0.0, "1.2.mirror:"), ("constant", 0.0, "1.2.constant~0.0:"),
    ("constant", -2.5e-08, "1.2.constant~-2.5e-08:"), ("constant", float("inf"), "constant~inf:")])
def test_the_derived_name_carries_a_stated_rule_and_reads_back(ends, cval, field):
  d = _description(periodic=False, ends=ends, cval=cval)
  name = derived_names.encode(d)
  assert f"$h:n={field}" in name or field in name, name
  assert derived_names.decode(name) == d


def test_a_description_with_a_halo_missing_from_a_result_is_refused():
  with pytest.raises(ValueError, match="every result"):
    CallDescription(target="t", operand_batch_ranks=(0,), result_batch_ranks=(0, 0),
                    operand_layouts=((0,),), result_layouts=((0,), (0,)),
                    halos=(HaloDim("n", 1, 1, False, ((0, -1),), ((0, -1),)),))


def test_the_shardy_rule_shares_the_halo_factor():
  halo = HaloDim("n", 1, 1, False, ((0, -1), (1, -1)), ((0, -1),))
  lhs, rhs, replicated, reduced = sharding_rule.factors(
      [(4, 16), (16,)], [1, 1], [(4, 16)], [1], (4,), halos=(halo,))
  assert sharding_rule.text(lhs, rhs) == "b0 h0, h0 -> b0 h0"
  assert not replicated and not reduced


def test_one_device_gives_the_kernels_values():
  x = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)
  attrs = dict(rank=np.int64(1), lo=np.int64(1), hi=np.int64(2), mode=np.int64(1))
  plain = jax.ffi.ffi_call(STENCIL, S(x.shape, x.dtype))(x, **attrs)
  out = jax.jit(lambda x: stencil(x.shape, {"n": bp.Halo(1, 2)})(x, **attrs))(x)
  np.testing.assert_array_equal(np.asarray(out), np.asarray(plain))


def _plan(halo, shape, tiles, operands=1):
  """The plan of a ``(b, n) -> (b, n)`` call (``operands`` copies of the
  operand) whose operands are tiled by ``tiles``."""
  d = CallDescription(
      target="t", operand_batch_ranks=(1,) * operands, result_batch_ranks=(1,),
      operand_layouts=((1, 0),) * operands, result_layouts=((1, 0),),
      halos=(HaloDim("n", halo.lo, halo.hi, halo.periodic,
                     tuple((k, -1) for k in range(operands)), ((0, -1),)),))
  sharding = compat.HloSharding.iota_tile(list(tiles))
  return make_plan(d, [list(shape)] * operands, [sharding] * operands, [list(shape)])


def test_the_plan_keeps_a_halo_dim_split_where_the_window_takes_it():
  plan = _plan(bp.Halo(1, 2), (4, 64), (1, 8))
  assert plan.halo_tiles == (8,) and plan.whole_halos == ()
  assert [list(s) for s in plan.operand_local_shapes] == [[4, 8]]
  assert list(plan.result_shardings[0].tile_dims) == [1, 8]


def test_the_plan_keeps_a_halo_dim_whole_where_no_split_takes_the_window():
  """5 over 8 (or 4, or 2) leaves no last part of lo + hi = 3: the dim is
  planned as a core dim, its axis moved onto the batch dim (4 rows)."""
  plan = _plan(bp.Halo(1, 2), (4, 5), (1, 8))
  assert plan.halo_tiles == (1,) and plan.whole_halos == ("n",)
  assert [list(s) for s in plan.operand_local_shapes] == [[1, 5]]


@pytest.mark.parametrize("n, parts, local", [(61, 8, 8), (30, 4, 8)])
def test_the_plan_keeps_an_uneven_halo_split_whose_last_part_takes_the_window(n, parts, local):
  """XLA's uneven split (parts of ceil(n / parts), the last short) stays
  where the last part holds lo + hi: 61 over 8 (the last 5), 30 over 4 (30
  over 8 would leave 2; the other factor of 2 replicated)."""
  plan = _plan(bp.Halo(1, 2), (4, n), (1, 8))
  assert plan.halo_tiles == (parts,) and plan.whole_halos == ()
  assert [list(s) for s in plan.operand_local_shapes] == [[4, local]]


@pytest.mark.parametrize("ends, n, ok", [
    (None, 61, True), ("nearest", 61, True), ("reflect", 61, True), ("mirror", 61, False),
    ("mirror", 64, True), ("reflect", 60, False), ("nearest", 60, True), ("wrap", 61, True)])
def test_an_uneven_split_takes_a_mirrored_end_where_the_last_part_holds_its_reach(ends, n, ok):
  """Padding the top end by reflection reads hi plus the last part's padding
  off the last part: 61 over 8 has parts of 8 and a last of 5, reaching
  2 + 3 = 5 (mirror, which skips the edge element: 6); 60's last part holds
  4. Other rules read no more than the edge element."""
  assert splits_into(bp.Halo(1, 2, ends=ends), n, 8) is ok


def test_the_plan_splits_a_halo_dim_less_finely_where_parts_would_be_too_short():
  """16 over 8 makes parts of 2 < lo + hi = 3; 4 parts of 4 take the window
  (the other factor of 2 replicated), as many devices apart as moving the
  axis onto the 4 rows would, so the halo dim stays split."""
  plan = _plan(bp.Halo(1, 2), (4, 16), (1, 8))
  assert plan.halo_tiles == (4,) and plan.whole_halos == ()
  assert [list(s) for s in plan.operand_local_shapes] == [[4, 4]]
  assert plan.replication == 2


def test_the_plan_prefers_a_batch_dim_to_a_coarser_halo_split():
  """With 8 rows, moving the axis onto them puts every device to work, where
  4 parts of the halo dim would leave half the devices doubled."""
  plan = _plan(bp.Halo(1, 2), (8, 16), (1, 8))
  assert plan.halo_tiles == (1,) and plan.whole_halos == ("n",)
  assert plan.replication == 1
